"""examples/tour.ipynb runs top to bottom on a real Jupyter kernel (nbclient): a model defined
in a cell compiles, explains itself once as a cell's value, prints its kernels, and trains."""
import os
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


@pytest.fixture(scope="module")
def tour():
    """The tour, executed: raises `CellExecutionError` naming the cell where one fails."""
    notebook = nbformat.read(os.path.join(EXAMPLES, "tour.ipynb"), as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": EXAMPLES}}).execute()
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def cell_running(cells, text):
    return next(cell for cell in cells if text in cell.source)


def test_every_cell_of_the_tour_runs_without_an_error(tour):
    assert all(cell.execution_count is not None for cell in tour)
    assert not [output for cell in tour for output in cell.outputs
                if output.output_type == "error"]


def test_explain_as_a_cells_last_line_shows_its_text_once_as_text_and_html(tour):
    outputs = cell_running(tour, "tree_rnn.explain(forest, p)").outputs
    assert [output.output_type for output in outputs] == ["execute_result"]
    data = outputs[0].data
    assert data["text/plain"].startswith("== tree_rnn: cell IR")
    assert data["text/html"].startswith("<pre>== tree_rnn: cell IR")


def test_a_result_as_a_cells_value_is_one_short_line(tour):
    outputs = cell_running(tour, "result = tree_rnn.run(forest, p)").outputs
    assert outputs[0].data["text/plain"] == "Result(5 roots; state: (16,) float64)"


def test_the_compiled_run_in_the_notebook_agrees_with_the_reference(tour):
    text = "".join(output.text for output in cell_running(tour, "difference =").outputs)
    difference = re.fullmatch(r"largest difference from the plain recursion: (.*)\n", text)
    assert float(difference.group(1)) < 1e-12


def test_training_in_the_notebook_lowers_the_loss(tour):
    text = "".join(output.text for output in cell_running(tour, "losses = []").outputs)
    first, last = map(float, re.fullmatch(r"loss ([0-9.]+) -> ([0-9.]+)\n", text).groups())
    assert last < first / 2
