"""Pydantic models of party B's JSON API and its problem+json errors.

Imports nothing of ours: both parties (and any third-party client) can depend on it alone.
The msgpack bodies of the training endpoints are described in docs/PROTOCOL.md instead.
"""

from api_schemas.alignment import PsiInfo
from api_schemas.problems import (
    MSGPACK_CONTENT_TYPE,
    PROBLEM_CONTENT_TYPE,
    PROBLEMS,
    Problem,
    ProblemKind,
    ProblemType,
)
from api_schemas.runs import (
    AlignmentIn,
    AlignmentOut,
    BatchScheduleSpec,
    ClientSchedule,
    EvalResultOut,
    FeatureParty,
    OptimizerSpec,
    PartyOut,
    QuantizerSpec,
    ResumeIn,
    RunCreate,
    RunList,
    RunOut,
    RunPrivacyOut,
    RunStatus,
    ShuffleSchedule,
    StepLogOut,
    StepLogPage,
    default_downlink,
)

__all__ = [
    "MSGPACK_CONTENT_TYPE",
    "PROBLEMS",
    "PROBLEM_CONTENT_TYPE",
    "AlignmentIn",
    "AlignmentOut",
    "BatchScheduleSpec",
    "ClientSchedule",
    "EvalResultOut",
    "FeatureParty",
    "OptimizerSpec",
    "PartyOut",
    "Problem",
    "ProblemKind",
    "ProblemType",
    "PsiInfo",
    "QuantizerSpec",
    "ResumeIn",
    "RunCreate",
    "RunList",
    "RunOut",
    "RunPrivacyOut",
    "RunStatus",
    "ShuffleSchedule",
    "StepLogOut",
    "StepLogPage",
    "default_downlink",
]
