"""The fields only runtime=ray reads: its cluster, its servers, its workers' GPUs, and
what it does when a worker process dies (declarations, importing nothing but the
declaring mechanism, so that easgd.config assembles them)."""

from easgd.declare import Field, Shapes, integer, number, one_of, text

FIELDS = (
  Field(
    "ray.address",
    "",
    text("HOST:PORT of a Ray head, 'auto', or '' (embedded)"),
    "the Ray cluster: HOST:PORT of its head, 'auto' (the one this node joined with ray start), "
    "or '' for RAY_ADDRESS or else an embedded one the run starts",
    Shapes.NEVER,
    earlier="",
  ),
  Field(
    "ray.servers",
    1,
    integer(1),
    "S: server actors the center is split over, by parameter blocks (at most the model's "
    "blocks; python -m easgd.plan says how many a model needs)",
    Shapes.NEVER,
    earlier=1,
  ),
  Field(
    "ray.worker_gpus",
    0.0,
    number(0, note="GPUs a worker process takes; 0: its CPU"),
    "GPUs each worker process takes (1 on a GPU cluster; a fraction shares one); 0: it "
    "runs on its CPU",
    Shapes.NEVER,
    earlier=0.0,
  ),
  Field(
    "cluster.on_worker_loss",
    "rejoin",
    one_of(("rejoin", "continue", "stop")),
    "runtime=ray, a worker process that dies: rejoin (Ray restarts it; it starts from the "
    "center), continue (the others go on without it) or stop (the run stops)",
    Shapes.NEVER,
    earlier="rejoin",
  ),
)
SERVERS, WORKER_GPUS = FIELDS[1:3]
