"""Both parties from Python, as a notebook would use them (``python examples/notebook.py``).

Party B serves in a thread of this process over real HTTP (``party_b.ops.background``); party A
connects to it with ``party_a.api.connect`` and trains, evaluates, predicts and finishes: the
five lines in the middle are all a notebook needs once party B is running somewhere. The data
is scikit-learn's breast-cancer set split between the parties, as in ``make demo``.
"""

import argparse
import shutil
from pathlib import Path

from party_a.api import connect
from party_b.ops.background import serve_in_thread
from shared.demo_data import write_party_a_demo, write_party_b_demo

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("notebook-state"))
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    features = write_party_a_demo(args.dir / "features.csv")
    labels = write_party_b_demo(args.dir / "labels.csv")

    # public demo data: label privacy off, so that the evaluation is on the true labels and
    # predict scores any id (party B's default is label DP: docs/PRIVACY.md)
    with serve_in_thread(
        labels=labels, data_dir=args.dir / "party_b", privacy="off,predict_train_ids=true"
    ) as party_b:
        # --- party A, in a notebook cell ---
        with connect(
            party_b.url,
            party_b.token,
            features=features,
            config=HERE / "breast.toml",
            overrides={"run.steps": args.steps},
            state_dir=args.dir / "party_a",
        ) as run:
            summary = run.train()
            metrics = run.evaluate().metrics
            scores = run.predict(["s0000", "s0001"]).scores
            finished = run.finish()

    print(f"trained {summary.last_step} steps, {summary.compression:.0f}x less uplink than raw")
    print(f"held-out accuracy {metrics['accuracy']:.3f}, AUC {metrics['auc']:.3f}")
    print("party B's scores of s0000, s0001:", [[round(float(v), 3) for v in r] for r in scores])
    print(f"run {finished.id} is {finished.status.value}")


if __name__ == "__main__":
    main()
