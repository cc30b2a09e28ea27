"""Score-matrix mode: the QB-Norm workflow for video, audio and any model whose score is not one
dot product. Read score matrices (:func:`load_scores`: memory-mapped .npy/.npz, the authors'
.pkl files read safely), evaluate and tune corrections on them (:func:`evaluate_scores`,
:func:`tune_scores`), and correct a matrix for a pipeline (:func:`correct_scores`). A single
correction is fitted on scores with :func:`hubless.corrections.score_fit.fit_scores`. See
``docs/score-matrices.md``.
"""

from hubless.score_matrices.correct import correct_scores
from hubless.score_matrices.evaluate import evaluate_scores
from hubless.score_matrices.files import load_mask, load_scores, read_pickled_array
from hubless.score_matrices.tune import tune_scores

__all__ = ["correct_scores", "evaluate_scores", "load_mask", "load_scores", "read_pickled_array", "tune_scores"]
