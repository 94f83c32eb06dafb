"""A server for the tests (`python tests/serve_app.py MODEL PORT [OPTIONS as JSON]`): `elmo serve`'s app, run
and embedder, with the stream's work wrapped so that a test can hold it and make it fail, whatever the machine's
speed.

- Gate: while the file `$ELMO_TEST_GATE` exists, an advance of the stream waits before it runs (the test then knows
  what is in the stream and what is queued).
- Fault: sentences joining with the word `FAIL` in one raise (`RuntimeError`), as sentences that fail in the biLM
  would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    from hf_elmo.embed import ElmoEmbedder, EmbedSettings
    from hf_elmo.embed.streaming import EmbedderStream
    from hf_elmo.serve import SERVE_SETTINGS, ServeOptions, create_app
    from hf_elmo.serve.server import run

    model, port = sys.argv[1], int(sys.argv[2])
    options = ServeOptions(port=port, **(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}))
    embedder = ElmoEmbedder(model, settings=EmbedSettings(**SERVE_SETTINGS))
    gate = Path(os.environ["ELMO_TEST_GATE"])

    class Held(EmbedderStream):
        def add(self, sentences, keys):
            if any("FAIL" in words for words in sentences):
                raise RuntimeError("sentences that fail (FAIL in one)")
            super().add(sentences, keys)

        def advance(self, to_the_end=False):
            while gate.exists():
                time.sleep(0.02)
            return super().advance(to_the_end)

    app = create_app(embedder, options, make_work=lambda: Held(embedder))
    run(app, options)


if __name__ == "__main__":
    main()
