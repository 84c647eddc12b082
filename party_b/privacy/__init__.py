"""Label privacy: what party B lets party A learn of its labels during training.

    policy.py      PrivacyPolicy, its presets (the default: ``protected``, label DP) and the
                   ``FEDLITE_B_PRIVACY`` switch's syntax (imports no torch: the settings and
                   the CLI read it)
    label_dp.py    label differential privacy: a run's randomized labels, the attack bound
    draws.py       label draws: randomized labels once per label table (keyed by party B's
                   draw secret, the table's content digest and the id), not per run
    truth.py       quality under label DP: the reply's label_rate for party A's estimates,
                   every evaluation on the true labels for party B's operator
    defences.py    gradient noise (max-norm alignment, Gaussian), randomized response, what
                   a step reply may carry
    marvell.py     Marvell's class-wise gradient noise
    run.py         RunPrivacy (a run's policy and secret) and ``protected_step``, the one
                   call the step protocol makes: the true outcome for party B's log, and the
                   reply party A may see
    serving.py     what ``predict`` answers for: the training split's ids or not
    accounting.py  the epsilon a token's runs spend (each label draw once), against its
                   budget (the operator's, else party B's default)

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
