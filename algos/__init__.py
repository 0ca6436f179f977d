"""graftzoo.algos: the Learner interface, pure functions (``functional``) and one module per algorithm."""
from graftzoo.algos.base import Learner, LearnerConfig, MiniBatch, StepContext, TrainBatch  # noqa: F401
from graftzoo.contract.registry import register_algo  # noqa: F401

from graftzoo.algos import dapo, dr_grpo, grpo, gspo, rloo  # noqa: F401,E402  (registration)
from graftzoo.algos import hora  # noqa: F401,E402
from graftzoo.algos import extra  # noqa: F401,E402
from graftzoo.algos import om_grpo  # noqa: F401,E402
from graftzoo.algos import hacpo  # noqa: F401,E402  (registration)
from graftzoo.algos import sgt  # noqa: F401,E402  (registration)
from graftzoo.algos import graft  # noqa: F401,E402  (registration)
