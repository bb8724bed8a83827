"""Sync EASGD, 8 workers, LeNet-5 on the 5,000 embedded MNIST digits.

Reaches about 95% center test accuracy in well under a minute on a 2-core CPU.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # What is trained, how.
  # sync_sgd | sync_easgd | sync_measgd | original_easgd | async_easgd | async_measgd
  # | hogwild_easgd | async_sgd | async_msgd | hogwild_sgd | downpour | pipeline
  config.algorithm = "sync_easgd"
  config.model = "lenet5"  # lenet5 | mlp | alexnet | resnet20 | vgg11
  config.dataset = "mnist5k"  # mnist5k | digits | mnist | fashion_mnist | cifar10 | cifar100
  config.data_dir = ""  # TFDS data_dir; "" for TFDS's default
  config.augment = "none"  # none | crop_flip (CIFAR's pad-4 random crop and horizontal flip)
  # Workers are an array axis sharded over devices; devices must divide workers.
  config.workers = 8  # P
  config.devices = 0  # D; 0: min(workers, 8) (virtual CPU devices are created)
  config.batch_size = 32  # per worker
  # Update rule.
  config.learning_rate = 0.1  # eta
  # mu (or delta with nesterov): sync_sgd, sync_measgd, async_measgd; at the master: async_msgd
  config.momentum = 0.0
  config.nesterov = False
  config.comm_period = 4  # tau: local steps between elastic exchanges
  config.moving_rate = 0.9 / 8  # alpha; beta = workers * moving_rate must be < 1
  config.n_sync = 4  # downpour: local steps between push and fetch
  config.server_optimizer = "sgd"  # downpour's master: sgd | adagrad
  config.weight_decay = 0.0  # lambda: every gradient is g + lambda*x
  # BatchNorm statistics (resnet20, vgg11): "averaged" into the center like the
  # parameters, so the center is one usable model; or "local" to each worker,
  # the center then scored with each worker's in turn (easgd/model_state.py).
  config.batch_stats = "averaged"
  # pipeline: M models trained at once, each with SGD on one device at a time,
  # moved along the ring of devices every stage_steps steps (easgd/pipeline.py).
  config.models = 4  # M; devices must divide it
  config.stage_steps = 25  # steps on one partition before the models move
  # Per-model values for the pipeline: a tuple of M values, or () for the
  # value above for every model (seeds: seed + m).
  config.per_model = ml_collections.ConfigDict()
  config.per_model.learning_rate = ()
  config.per_model.momentum = ()
  config.per_model.weight_decay = ()
  config.per_model.seed = ()
  # The timing model (easgd/cluster.py): it orders the parameter-server rules'
  # requests and gives every rule a simulated clock (sim/time). Seconds, bytes.
  # This one: CPU workers of 10 ms a step, the slowest 1.5x slower than the
  # fastest, 10% jitter, on 1 Gbit/s Ethernet; the master takes 1 ms a request.
  config.cluster = ml_collections.ConfigDict()
  config.cluster.compute_time = 0.01  # mean local step of the fastest worker
  config.cluster.speed_spread = 0.5  # worker i is (1 + speed_spread * i / (P - 1)) slower
  config.cluster.jitter = 0.1  # lognormal sigma of each step's time
  config.cluster.stragglers = ()  # worker indices, e.g. (3,)
  config.cluster.straggler_slowdown = 4.0
  config.cluster.latency = 5e-4  # per message
  config.cluster.bandwidth = 1.25e8  # bytes/second
  config.cluster.master_time = 1e-3  # master service time per request
  config.cluster.servers = 1  # parameter servers the center is split over
  config.cluster.server_bandwidth = float("inf")  # each server's link; inf: not modelled
  config.cluster.allreduce = "ring"  # ring | tree
  # The device, for the planner (python -m easgd.plan): bytes, and the FLOP/s a
  # training step sustains (0: steps take compute_time).
  config.cluster.device_memory = 16e9
  config.cluster.device_flops = 0.0
  # Schedule.
  config.total_steps = 600
  config.log_every = 50
  config.eval_every = 100
  config.checkpoint_every = 200
  config.seed = 0
  return config
