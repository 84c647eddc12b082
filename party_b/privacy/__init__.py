"""Label privacy: what party B lets party A learn of its labels during training.

    policy.py    PrivacyPolicy, its presets and the ``FEDLITE_B_PRIVACY`` switch's syntax
                 (imports no torch: the settings and the CLI read it)
    defences.py  gradient noise (max-norm alignment, Gaussian), randomized response, what a
                 step reply may carry
    run.py       RunPrivacy (a run's policy and secret) and ``protected_step``, the one call
                 the step protocol makes: the true outcome for party B's log, and the reply
                 party A may see

docs/PRIVACY.md has the threat model and what each defence costs, measured.
"""

from party_b.privacy.policy import METRICS_POLICIES, PRESETS, PrivacyPolicy, parse_policy

__all__ = ["METRICS_POLICIES", "PRESETS", "PrivacyPolicy", "parse_policy"]
