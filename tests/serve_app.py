"""A server for the tests (`python tests/serve_app.py MODEL PORT [OPTIONS as JSON]`): `elmo serve`'s app, run
and embedder, with the batches' work wrapped so that a test can hold it and make it fail, whatever the machine's
speed.

- Gate: while the file `$ELMO_TEST_GATE` exists, a batch waits before it runs (the test then knows what is queued).
- Fault: a batch holding the word `FAIL` raises (`RuntimeError`), as a batch that fails would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    from hf_elmo.embed import ElmoEmbedder, EmbedSettings
    from hf_elmo.serve import SERVE_SETTINGS, ServeOptions, create_app
    from hf_elmo.serve.app import batch_work
    from hf_elmo.serve.server import run

    model, port = sys.argv[1], int(sys.argv[2])
    options = ServeOptions(port=port, **(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}))
    embedder = ElmoEmbedder(model, settings=EmbedSettings(**SERVE_SETTINGS))
    work = batch_work(embedder)
    gate = Path(os.environ["ELMO_TEST_GATE"])

    def embed(sentences):
        while gate.exists():
            time.sleep(0.02)
        if any("FAIL" in words for words in sentences):
            raise RuntimeError("a batch that fails (FAIL in it)")
        return work(sentences)

    app = create_app(embedder, options, embed=embed)
    run(app, options)


if __name__ == "__main__":
    main()
