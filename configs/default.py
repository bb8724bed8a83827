"""Sync EASGD, 8 workers, LeNet-5 on the 5,000 embedded MNIST digits.

Reaches 0.964 center test accuracy at step 600; on a 2-core CPU the run took
58 s (`python train.py --config configs/default.py`, 2026-11-25).
Fields are grouped the way the code is (docs/configuration.md lists every
field); override any with --config.GROUP.FIELD=VALUE.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # What is trained, by whom. Rules: python -c "from easgd import rules; print(list(rules.RULES))"
  config.algorithm = "sync_easgd"  # a rule of easgd.rules.registry, or "pipeline"
  # lenet5 | mlp | alexnet | resnet20 | vgg11 (CIFAR-sized); resnet50 | alexnet_imagenet (ImageNet)
  config.model = "lenet5"
  config.workers = 8  # P; an array axis sharded over the devices
  config.seed = 0
  # Sums over workers added in worker order after an all-gather, instead of an
  # all-reduce in the layout's order, and XLA:CPU's thread pool sized by the run:
  # the same bits on every process layout with the same workers a device
  # (docs/distributed.md, "Layouts and bits"; bench/deterministic_sums.py measures the cost).
  config.deterministic_sums = False
  # What the models compute in: "float32", or "bfloat16" for activations, matrix
  # products and convolutions (for accelerators; slower on a CPU). Parameters, the
  # center, optimizer state, BatchNorm statistics, the loss and the exchanges'
  # sums stay float32 (docs/running.md, "Computing in bfloat16").
  config.dtype = "float32"
  # How the rules run (easgd/train/runtimes/): "simulated"
  # steps them all in each tick of the timing model's schedule (cluster.*);
  # "threads" runs each worker in its own host thread without waiting for the
  # others, serves the center under the rule's discipline, and writes every
  # master operation to WORKDIR/trace.jsonl, which cluster.replay replays
  # (docs/asynchrony.md, "Real asynchrony").
  config.runtime = "simulated"

  # The data and each worker's batches.
  config.data = ml_collections.ConfigDict()
  # mnist5k | digits | mnist | fashion_mnist | cifar10 | cifar100 | imagenette |
  # imagenet2012 | records (a folder of easgd.data.convert in run.data_dir)
  config.data.dataset = "mnist5k"
  config.data.augment = "none"  # none | crop_flip (CIFAR's pad-4 random crop and flip)
  config.data.batch_size = 32  # per worker (pipeline: per model)
  # Where the workers' examples come from (easgd/data/stream.py): "device" places
  # the training partitions on the devices once; "stream" reads each worker's
  # batches on the host as it trains (the same batches); "auto" places them when
  # one device's partitions fit in device_budget bytes, else streams.
  config.data.source = "auto"  # auto | device | stream
  config.data.device_budget = 2e9  # bytes a device may hold of training data

  # The workers' local step: an optax optimizer and its learning-rate schedule
  # (easgd/rules/optimizers.py); sync_sgd's shared model takes it too.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "sgd"  # sgd | adamw
  config.optimizer.learning_rate = 0.1  # eta; the peak under a schedule
  # sgd's mu (classic or Nesterov): optional for the rules with a center and
  # sync_sgd, required by sync_measgd and async_measgd; async_msgd's master's
  config.optimizer.momentum = 0.0
  config.optimizer.nesterov = False
  # lambda: sgd adds lambda*x to every gradient (L2); adamw decays decoupled
  config.optimizer.weight_decay = 0.0
  config.optimizer.b1 = 0.9  # adamw's moments
  config.optimizer.b2 = 0.999
  config.optimizer.eps = 1e-8
  # constant | warmup_cosine | warmup_step, over run.total_steps of each
  # worker's own local steps: warmup_steps of linear warm-up from 0, then a
  # cosine to 0, or a multiplication by decay_factor at each boundary (fractions
  # of run.total_steps).
  config.optimizer.schedule = "constant"
  config.optimizer.warmup_steps = 0
  config.optimizer.boundaries = (0.5, 0.75)
  config.optimizer.decay_factor = 0.1

  # The center and the exchanges with it (easgd/rules/outer.py): every tau
  # steps the pseudo-gradient Delta = mean_i (center - x_i) moves the center
  # through the outer optimizer, and the workers are pulled back.
  config.outer = ml_collections.ConfigDict()
  config.outer.comm_period = 4  # tau: local steps between exchanges
  # alpha of the elastic pull, beta = workers * alpha < 1; 0: beta = 0.9 (the
  # EASGD authors'), alpha = 0.9 / workers. A reset pull has no alpha: leave it 0.
  config.outer.moving_rate = 0.0
  config.outer.pull = ""  # "": the rule's own | elastic | reset (diloco takes either)
  # The outer optimizer: diloco's (these defaults are DiLoCo's); lookahead's
  # slow-weight rate alpha is outer.learning_rate.
  config.outer.optimizer = "sgd"  # sgd | adam
  config.outer.learning_rate = 0.7  # eta_o
  config.outer.momentum = 0.9  # mu_o
  config.outer.nesterov = True
  # What a worker sends at an exchange: float32 | bfloat16 | int8 (per-tensor
  # scale, stochastic rounding; easgd/rules/exchange.py).
  config.outer.exchange_dtype = "float32"
  # BatchNorm statistics (resnet20, vgg11): "averaged" into the center like the
  # parameters, so the center is one usable model; or "local" to each worker,
  # the center then scored with each worker's in turn (easgd/rules/model_state.py).
  config.outer.batch_stats = "averaged"

  # Downpour's workers and master.
  config.downpour = ml_collections.ConfigDict()
  config.downpour.n_sync = 4  # local steps between push and fetch
  config.downpour.server_optimizer = "sgd"  # the master's: sgd | adagrad

  # The pipeline: M models trained at once, each with the optimizer group's
  # optimizer and schedule on one device at a time, moved along the ring of
  # devices every stage_steps steps.
  config.pipeline = ml_collections.ConfigDict()
  config.pipeline.models = 4  # M; the devices must divide it
  config.pipeline.stage_steps = 25  # steps on one partition before the models move
  # Per-model values: a tuple of M values, or () for the value of the
  # optimizer group (seeds: seed + m) for every model.
  config.pipeline.per_model = ml_collections.ConfigDict()
  config.pipeline.per_model.learning_rate = ()
  config.pipeline.per_model.momentum = ()
  config.pipeline.per_model.weight_decay = ()
  config.pipeline.per_model.b1 = ()
  config.pipeline.per_model.b2 = ()
  config.pipeline.per_model.seed = ()

  # The timing model (easgd/sim/timing.py): it orders the parameter-server
  # rules' requests and gives every rule a simulated clock (sim/time). Seconds,
  # bytes. This one: CPU workers of 10 ms a step, the slowest 1.5x slower than
  # the fastest, 10% jitter, on 1 Gbit/s Ethernet; the master takes 1 ms a request.
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
  # A trace.jsonl of a runtime=threads run: the simulated runtime replays its
  # recorded order of operations instead of the timing model's. "": off.
  config.cluster.replay = ""

  # The device, for the planner only (python -m easgd.plan): bytes, and the
  # FLOP/s a training step sustains (0: steps take cluster.compute_time).
  config.device = ml_collections.ConfigDict()
  config.device.memory = 16e9
  config.device.flops = 0.0

  # How long the run goes, where it runs and what it reports: these may
  # change when a run is resumed, and are not hyper-parameters.
  config.run = ml_collections.ConfigDict()
  config.run.total_steps = 600
  config.run.log_every = 50
  config.run.eval_every = 100
  config.run.checkpoint_every = 200
  # D: devices the workers (pipeline: models) are spread over; they must
  # divide them. 0: the largest divisor of them that is at most 8 and at
  # most the devices there are (virtual CPU devices are created on a CPU).
  config.run.devices = 0
  config.run.data_dir = ""  # TFDS data_dir ("" for TFDS's default), or a records folder
  # "START:STEPS": a jax.profiler trace of steps START+1 .. START+STEPS into
  # WORKDIR/profile, for TensorBoard's Profile tab (pip install xprof; docs/running.md,
  # "Profiling a window of steps"); only those steps pay for it. "": off.
  config.run.profile = ""
  return config
