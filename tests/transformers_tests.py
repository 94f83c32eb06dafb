"""transformers' own common model tests (`ModelTesterMixin`, shipped in the transformers sdist's `tests/`), for
`test_transformers_common.py`.

`python tests/transformers_tests.py` (run by `make test`) downloads the sdist of the installed transformers from the
package index once and keeps its `tests/test_modeling_common.py` and `tests/test_configuration_common.py` as the
package `transformers_common` in `<virtualenv>/transformers-tests/<version>/`. The sibling modules they import that
the sdist does not ship are written as empty stand-ins: the export mixin (export is tested by `test_model.py`), the
generation mixin (ELMo does not generate) and the configuration test's shared keyword arguments.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers

ROOT = Path(sys.prefix) / "transformers-tests" / transformers.__version__
PACKAGE = ROOT / "transformers_common"
KEPT = ("test_modeling_common.py", "test_configuration_common.py")
STAND_INS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    "utils/test_configuration_utils.py": "config_common_kwargs = {}\n",
}


def fetch() -> Path:
    """The `transformers_common` package of the installed version (downloaded when missing); its parent goes on
    `sys.path`."""
    if all((PACKAGE / name).is_file() for name in KEPT):
        return ROOT
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"transformers=={transformers.__version__}", "--dest", download],
            check=True,
        )
        (sdist,) = Path(download).glob("transformers-*.tar.gz")
        ROOT.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=ROOT))
        with tarfile.open(sdist) as archive:
            for name in KEPT:
                member = archive.getmember(f"transformers-{transformers.__version__}/tests/{name}")
                (staging / name).write_bytes(archive.extractfile(member).read())
    for path, text in {"__init__.py": "", **STAND_INS}.items():
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        (staging / path).parent.joinpath("__init__.py").touch()
        (staging / path).write_text(text)
    shutil.rmtree(PACKAGE, ignore_errors=True)  # an incomplete earlier copy
    staging.replace(PACKAGE)
    return ROOT


if __name__ == "__main__":
    print(fetch() / PACKAGE.name)
