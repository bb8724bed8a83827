"""Sync EASGD, 8 workers, ResNet-50 (v1.5) on ImageNet (ILSVRC-2012): the ResNet recipe.

He et al. (2016, Sec. 3.4) train ResNet-50 with SGD, momentum 0.9, weight
decay 1e-4 and learning rate 0.1 at batch 256, divided by 10 when the error
plateaus. Goyal et al. (2017) fixed that schedule as 90 epochs with the rate
divided by 10 at epochs 30, 60 and 80, scaled the rate linearly with the
batch (0.1 per 256 images) and warmed it up linearly over 5 epochs. Here
each of the 8 workers takes that SGD on its own batch of 256 (its inner
optimizer), so the rate is 0.1 x 256/256 per worker; only sync_sgd, whose
one step sees the global batch of 8 x 256, would scale it with that batch
(x 8). Each worker makes 90 passes over its 160,145 images (625 steps a
pass): 56,250 local steps, warm-up over the first 5 passes, x 0.1 at 1/3,
2/3 and 8/9 of the run. Elastic averaging every 4 steps with beta = 0.9.

Augmentation: "crop_flip" (a random crop of the image zero-padded by 4
pixels, and a left-right flip) is the only one the code has; the papers'
scale augmentation (random-sized crops, resized) is not reproduced, so
their 75-77% top-1 is not the target here. Not run on this project's
machines (no ImageNet, no accelerator); `python -m easgd.plan --config
configs/imagenet2012_resnet50.py` sizes it for the device below.

Preparing the data, on a machine with internet access (TensorFlow is needed
there, not here; docs/data.md, "ImageNet-class data"):

  pip install tensorflow-cpu tensorflow-datasets==4.9.10
  # ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar, downloaded by hand
  # from image-net.org after registering, go into DIR/downloads/manual/ first.
  tfds build imagenet2012 --file_format=array_record --data_dir=DIR

then copy DIR over and pass --config.run.data_dir=DIR.
"""

import ml_collections

from easgd.configs import default


def on_h100_cluster(config: ml_collections.ConfigDict) -> None:
  """The planner's device and the timing model's links: one NVIDIA H100 SXM a worker,
  one 400 Gbit/s InfiniBand (NDR) link a GPU, as in a DGX H100."""
  config.device.memory = 80e9  # H100 SXM: 80 GB of HBM3
  # The H100 SXM's dense bfloat16 tensor-core peak, 989 TFLOP/s (67 for float32
  # without tensor cores). A training step sustains a fraction of it, so the
  # planner's step time (FLOPs / this rate) is a lower bound.
  config.device.flops = 989e12
  config.cluster.bandwidth = 50e9  # bytes/s: 400 Gbit/s
  config.cluster.latency = 5e-6
  config.cluster.speed_spread = 0.0  # equal GPUs
  config.cluster.jitter = 0.05


def get_config():
  config = default.get_config()
  config.model = "resnet50"
  config.data.dataset = "imagenet2012"
  config.data.augment = "crop_flip"
  # Activations and convolutions in bfloat16 on the accelerator (the parameters,
  # center and optimizer state stay float32); --config.dtype=float32 for the papers'.
  config.dtype = "bfloat16"
  config.outer.batch_stats = "averaged"
  config.workers = 8
  config.data.batch_size = 256  # per worker, the papers' batch
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.1 * config.data.batch_size / 256
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 1e-4
  config.optimizer.schedule = "warmup_step"
  config.optimizer.warmup_steps = 5 * 625
  config.optimizer.boundaries = (30 / 90, 60 / 90, 80 / 90)
  config.optimizer.decay_factor = 0.1
  config.outer.comm_period = 4
  config.outer.moving_rate = 0.9 / 8
  on_h100_cluster(config)
  # The simulated clock's step: the planner's t_c, 6,161 GFLOP (XLA's count of a
  # local step at batch 256) at the peak above; like it, a lower bound.
  config.cluster.compute_time = 6.2e-3
  config.run.total_steps = 90 * 625
  config.run.log_every = 100
  config.run.eval_every = 10 * 625
  config.run.checkpoint_every = 625
  return config
