from pathlib import Path

from pydantic import Field

from aml_runtime.settings import EvaluationSettings, ParticipantCallSettings


class SchedulerSettings(ParticipantCallSettings, EvaluationSettings):
    # Where the benchmark files named by the bundle manifests live (licences keep them out of
    # the repository), with the operator's manifests in its `manifests/` (`aml dataset add`);
    # the shipped synthetic dataset needs none.
    datasets_root: Path = Path("../shared/datasets")
    # Every running job is re-checked this often, so a crash between a database write and a
    # publish can delay a job but never strand it.
    reconcile_interval_seconds: float = Field(default=20.0, gt=0)
    # A run's derived data (bodies, candidates, answers) is deleted this long after it ended,
    # unless an admin keeps it longer.
    retention_days: float = Field(default=30.0, gt=0)
    # A running job that no item's outcome has moved for this long is failed, naming the stage
    # it is stuck in and whether the participant or the platform stalled it (never sooner than
    # ten of the version's declared request periods nor twice the participant call timeout;
    # aml_scheduler.watchdog).
    job_stall_seconds: float = Field(default=1800.0, gt=0)
    # Where this deployment calls participants from (e.g. its cloud region), named in every
    # job's efficiency figures (`measured_under.deployment`): latency is measured from here,
    # network included, so figures compare only between results of the same deployment.
    deployment_label: str = "embedded"
