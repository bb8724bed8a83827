"""Sync EASGD, 8 workers, AlexNet on ImageNet (ILSVRC-2012): SC17's network and Krizhevsky's recipe.

You, Buluc and Demmel (SC17) time Sync EASGD on 8 GPUs with a 249 MB
AlexNet: models/alexnet_imagenet.py, 62.4M float32 parameters at 224x224
(docs/scaling.md sets their timings against the timing model). Krizhevsky
et al. (2012) train it with SGD, momentum 0.9, weight decay 5e-4 and
learning rate 0.01 at batch 128, divided by 10 three times when the
validation error stopped improving, over about 90 epochs. Here each of the
8 workers takes that SGD on its own batch of 128 (its inner optimizer),
for 90 passes over its 160,145 images (1,251 steps a pass): 112,590 local
steps, with the rate divided by 10 at 1/3, 2/3 and 8/9 of the run (passes
30, 60 and 80, the schedule later ImageNet recipes fixed). Sync EASGD as
SC17 runs it: an exchange every step (tau = 1), beta = 0.9.

Augmentation: "crop_flip" (a random crop of the image zero-padded by 4
pixels, and a left-right flip) is the only one the code has, not the
paper's random 224x224 crops of 256x256 images and colour noise; without
them and dropout (models/alexnet_imagenet.py) AlexNet overfits, so the
paper's 59.3% top-1 (one network) is not the target here. Not run on this
project's machines (no ImageNet, no accelerator); `python -m easgd.plan
--config configs/imagenet2012_alexnet.py` sizes it for the device below.

Preparing the data, on a machine with internet access (TensorFlow is needed
there, not here; docs/data.md, "ImageNet-class data"):

  pip install tensorflow-cpu tensorflow-datasets==4.9.10
  # ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar, downloaded by hand
  # from image-net.org after registering, go into DIR/downloads/manual/ first.
  tfds build imagenet2012 --file_format=array_record --data_dir=DIR

then copy DIR over and pass --config.run.data_dir=DIR.
"""

from easgd.configs import default
from easgd.configs.imagenet2012_resnet50 import on_h100_cluster


def get_config():
  config = default.get_config()
  config.model = "alexnet_imagenet"
  config.data.dataset = "imagenet2012"
  config.data.augment = "crop_flip"
  # Activations and matrix products in bfloat16 on the accelerator (the parameters,
  # center and optimizer state stay float32); --config.dtype=float32 for SC17's.
  config.dtype = "bfloat16"
  config.workers = 8
  config.data.batch_size = 128  # per worker, the paper's batch
  config.optimizer.name = "sgd"
  config.optimizer.learning_rate = 0.01
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 5e-4
  config.optimizer.schedule = "warmup_step"
  config.optimizer.warmup_steps = 0
  config.optimizer.boundaries = (30 / 90, 60 / 90, 80 / 90)
  config.optimizer.decay_factor = 0.1
  config.outer.comm_period = 1
  config.outer.moving_rate = 0.9 / 8
  on_h100_cluster(config)
  # The simulated clock's step: the planner's t_c, 779 GFLOP (XLA's count of a
  # local step at batch 128) at the H100's peak; a lower bound. An exchange of
  # the 249 MB model every step then takes most of the time, as in SC17.
  config.cluster.compute_time = 7.9e-4
  config.run.total_steps = 90 * 1251
  config.run.log_every = 100
  config.run.eval_every = 10 * 1251
  config.run.checkpoint_every = 1251
  return config
