"""The documents' code is code: every python block parses, and each whole program among them
runs as written, copied into a file and run as a reader would, with the examples on the path
and the Stanford Sentiment Treebank at ../shared/data/sst (skipped where it is absent)."""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SHARED = os.path.abspath(os.path.join(ROOT, "..", "shared"))
DOCUMENTS = ["README.md"] + sorted(os.path.relpath(path, ROOT)
                                   for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))

# A reader's program: (document, its python blocks joined in order, what its output shows).
PROGRAMS = {
    "the README's quick start and corpus loop": ("README.md", slice(0, 2),
                                                 r"== tree_lstm: cell IR"),
    "the training guide's loop": ("docs/training.md", slice(2, 3), r"\n19 [0-9.]+\n"),
    "the PyTorch guide's step": ("docs/torch.md", slice(0, 1), r""),
    "the Dask guide's local cluster": ("docs/scale.md", slice(0, 1), r"\(8544, 150\)"),
}


def python_blocks(document):
    with open(os.path.join(ROOT, document)) as handle:
        return re.findall(r"```python\n(.*?)```", handle.read(), re.DOTALL)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_python_block_of_a_document_parses(document):
    for number, block in enumerate(python_blocks(document)):
        ast.parse(block, filename=f"{document}, python block {number + 1}")


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "data", "sst")),
                    reason="needs ../shared/data/sst")
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_documents_whole_program_runs_as_written(name, tmp_path):
    """From a directory beside ../shared, as from the repository's root, so that what the
    program writes stays in the test's own directory."""
    document, blocks, shown = PROGRAMS[name]
    source = "\n".join(python_blocks(document)[blocks])
    assert source, f"{document} has no python blocks {blocks}"
    (tmp_path / "shared").symlink_to(SHARED)
    work = tmp_path / "work"
    work.mkdir()
    (work / "program.py").write_text(source)
    environment = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "examples")}
    ran = subprocess.run([sys.executable, "program.py"], cwd=work, env=environment,
                         capture_output=True, text=True, timeout=600, check=False)
    assert ran.returncode == 0, f"{name} ({document}) failed:\n{ran.stderr[-3000:]}"
    assert re.search(shown, ran.stdout), f"{name} printed:\n{ran.stdout[-2000:]}"
