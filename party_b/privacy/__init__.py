"""Label privacy: what party B lets party A learn of its labels during training.

    policy.py      PrivacyPolicy, its presets (the default: ``protected``, label DP) and the
                   ``FEDLITE_B_PRIVACY`` switch's syntax (imports no torch: the settings and
                   the CLI read it)
    label_dp.py    label differential privacy: a run's randomized labels, the attack bound
    defences.py    gradient noise (max-norm alignment, Gaussian), randomized response, what
                   a step reply may carry
    marvell.py     Marvell's class-wise gradient noise
    run.py         RunPrivacy (a run's policy and secret) and ``protected_step``, the one
                   call the step protocol makes: the true outcome for party B's log, and the
                   reply party A may see
    serving.py     what ``predict`` answers for: the training split's ids or not
    accounting.py  the epsilon each run spends, per token, against the operator's budget

docs/PRIVACY.md has the threat model and what each defence costs, measured.
"""

from party_b.privacy.policy import (
    DEFAULT_PRESET,
    METRICS_POLICIES,
    PRESETS,
    PrivacyPolicy,
    parse_policy,
)

__all__ = ["DEFAULT_PRESET", "METRICS_POLICIES", "PRESETS", "PrivacyPolicy", "parse_policy"]
