"""Sync EASGD, 4 workers, ResNet-50 (v1.5) on Imagenette: ImageNet's recipe on ten of its classes.

Imagenette (Howard 2019; TFDS imagenette/160px-v2) holds 9,469 training and
3,925 validation images of 10 easily told ImageNet classes, the shorter side
at 160 pixels, cropped here to 160x160 at the center. The recipe is
configs/imagenet2012_resnet50.py's: SGD with momentum 0.9, weight decay
1e-4, 0.1 per 256 images (0.025 at each worker's batch of 64), a linear
warm-up over 5 passes (Goyal et al. 2017), then a cosine to 0, which suits
a run this short. Each of the 4 workers makes 80 passes over its 2,367
images (36 steps a pass): 2,880 local steps. Elastic averaging every 4
steps with beta = 0.9.

A data set small enough to train ResNet-50 from scratch in hours on one
accelerator: the step before a whole ImageNet run. Not run on this
project's machines (no Imagenette, no accelerator), so no target accuracy
is given; `python -m easgd.plan --config configs/imagenette_resnet50.py`
sizes it for the device set below.

Preparing the data, on a machine with internet access (TensorFlow is needed
there, not here; docs/data.md, "ImageNet-class data"):

  pip install tensorflow-cpu tensorflow-datasets==4.9.10
  tfds build imagenette/160px-v2 --file_format=array_record --data_dir=DIR

then copy DIR over and pass --config.run.data_dir=DIR.
"""

from easgd.configs import default
from easgd.configs.imagenet2012_resnet50 import on_h100_cluster


def get_config():
  config = default.get_config()
  config.model = "resnet50"
  config.data.dataset = "imagenette"
  config.data.augment = "crop_flip"  # the only augmentation there is: pad 4, crop, flip
  # Activations and convolutions in bfloat16 on the accelerator (the parameters,
  # center and optimizer state stay float32); --config.dtype=float32 for full precision.
  config.dtype = "bfloat16"
  config.outer.batch_stats = "averaged"
  config.workers = 4
  config.data.batch_size = 64  # per worker
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.1 * config.data.batch_size / 256
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 1e-4
  config.optimizer.schedule = "warmup_cosine"
  config.optimizer.warmup_steps = 5 * 36
  config.outer.comm_period = 4
  config.outer.moving_rate = 0.9 / 4
  on_h100_cluster(config)
  # The simulated clock's step: the planner's t_c, 776 GFLOP (XLA's count of a
  # local step at batch 64) at the H100's peak; a lower bound.
  config.cluster.compute_time = 7.8e-4
  config.run.total_steps = 80 * 36
  config.run.log_every = 36
  config.run.eval_every = 10 * 36
  config.run.checkpoint_every = 10 * 36
  return config
