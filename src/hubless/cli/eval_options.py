"""The options of ``hubless eval`` and ``hubless tune``, each declared once with its help and
the help panel of the mode it belongs to (``--help`` shows them grouped: embeddings, score
matrices, an attached collection, rerank, what is measured, output). Which mode takes which
option is the fields of the mode's options object (:mod:`hubless.cli.modes`)."""

from __future__ import annotations

import typer

from hubless.cli._common import METHOD_HELP, NORMALIZE_HELP, OVERWRITE_HELP

TIES_HELP = (
    "How tied scores rank: index (the lower gallery index first, hubless's rule), average (the mean of the tied positions: "
    "the collaborative-experts metric of the QB-Norm tables) or optimistic (tied relevant items first); several relevant items tied together never cost a hit."
)
TRANSPOSE_HELP = (
    "Every score matrix is stored the other way round (gallery x queries, e.g. a text x video matrix evaluated video->text; "
    "bank matrices gallery x bank): read them transposed. Truth follows the queries, e.g. i2t:20."
)
MASK_HELP = (
    "One boolean per stored row of --scores (.npy/.pkl; the authors' test_query_masks): False rows are padding (MSR-VTT has two "
    "videos with 19 of 20 captions). Left out as queries; with --transpose, removed from the gallery."
)
PROGRESS_HELP = "Progress bars and the stage line on stderr (default: on a terminal)."

EMBEDDINGS = "Embeddings"
SCORES = "Score matrices: instead of embeddings (docs/score-matrices.md)"
ATTACHED = "An attached collection: instead of embeddings and a truth (docs/attach.md)"
RERANK = "Rerank and ECCV Caption: embeddings with one query bank"
VALIDATION = "Validation split: where the parameters are chosen"
MEASURES = "What is measured"
OUTPUT = "Output"

# ------------------------------------------------------------------------------- both commands
GALLERY_BANK = typer.Option(
    None, help="Reference items of the gallery's modality (DualIS/DualDIS need it; DN uses its mean).", rich_help_panel=EMBEDDINGS
)
DISTRACTORS = typer.Option(
    None,
    help="Extra (test) gallery items that are never relevant, appended after the gallery (a distractor-enlarged gallery).",
    rich_help_panel=EMBEDDINGS,
)
NORMALIZE = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP, rich_help_panel=EMBEDDINGS)
KS = typer.Option("1,5,10", help="Cut-offs K of R@K, comma-separated.", rich_help_panel=MEASURES)
TIES = typer.Option("index", help=TIES_HELP, rich_help_panel=MEASURES)
QUERY_BANK_SCORES = typer.Option(
    None, help="With --scores: query bank x gallery scores (NNN, CSLS, IS, DIS, GC, ...).", rich_help_panel=SCORES
)
GALLERY_BANK_SCORES = typer.Option(None, help="With --scores: gallery bank x gallery scores (DualIS/DualDIS).", rich_help_panel=SCORES)
QUERY_MASK = typer.Option(None, help="With --scores: " + MASK_HELP, rich_help_panel=SCORES)
TRANSPOSE = typer.Option(False, "--transpose", help="With score matrices: " + TRANSPOSE_HELP, rich_help_panel=SCORES)
REPORT = typer.Option(None, help="Write a self-contained HTML report with plots here.", rich_help_panel=OUTPUT)
PROGRESS = typer.Option(None, "--progress/--no-progress", help=PROGRESS_HELP, rich_help_panel=OUTPUT)
OVERWRITE = typer.Option(False, help=OVERWRITE_HELP, rich_help_panel=OUTPUT)

# ----------------------------------------------------------------------------------- hubless eval
GALLERY = typer.Option(None, help="Gallery embeddings (.npy, or .npz / file.npz:KEY), one row per item.", rich_help_panel=EMBEDDINGS)
QUERIES = typer.Option(None, help="Test query embeddings, same dimension (also with --attached).", rich_help_panel=EMBEDDINGS)
TRUTH = typer.Option(
    None,
    help="Relevant gallery ids per query: .npy (ids, or -1-padded rows), .json, or a layout: t2i:5 / i2t:5 (also with --scores).",
    rich_help_panel=EMBEDDINGS,
)
QUERY_BANK = typer.Option(
    None,
    help="Reference queries (same modality as the queries, disjoint from them). Needed by every method but the baseline. "
    "Repeat as NAME=PATH to evaluate with several banks: one row per method x bank and the geometric mean over banks.",
    rich_help_panel=EMBEDDINGS,
)
METHODS = typer.Option(["baseline", "nnn"], "--method", "-m", help=METHOD_HELP, rich_help_panel=MEASURES)
BOOTSTRAP = typer.Option(1000, help="Bootstrap resamples for 95% CIs (0: none).", rich_help_panel=MEASURES)
SEED = typer.Option(0, help="Seed of the bootstrap.", rich_help_panel=MEASURES)
OUT = typer.Option(None, help="Write the results as JSON here (atomic).", rich_help_panel=OUTPUT)
RERANK_MODEL = typer.Option(
    None,
    help="Cross-encoder to rerank each method's top --rerank-k with (BLIP ITM or sentence-transformers CrossEncoder name/folder); "
    "reports retrieve-only vs retrieve+rerank R@K and latency.",
    rich_help_panel=RERANK,
)
RERANK_K = typer.Option(20, help="Candidates per query given to the reranker.", rich_help_panel=RERANK)
FUSION = typer.Option(None, help="Score fusion: add or norm_add (default: plain rerank).", rich_help_panel=RERANK)
FUSION_WEIGHT = typer.Option(None, help="Weight of the bi-encoder score in fusion (default 0.1).", rich_help_panel=RERANK)
LAM = typer.Option(None, hidden=True, help="Deprecated name of --fusion-weight.", rich_help_panel=RERANK)
GALLERY_ITEMS = typer.Option(
    None, help="With --rerank: the gallery items (image paths or texts), .txt/.json or an embed .meta.json.", rich_help_panel=RERANK
)
QUERY_ITEMS = typer.Option(None, help="With --rerank: the query items (texts or image paths), same formats.", rich_help_panel=RERANK)
ECCV = typer.Option(
    False,
    "--eccv",
    help="COCO-5k only (gallery: the 5,000 test images, queries: their 25,000 captions, Karpathy order): also report ECCV Caption "
    "mAP@R, R-Precision, R@1 and CxC R@1, both directions (needs --gallery-bank as the image bank).",
    rich_help_panel=RERANK,
)
EVAL_SCORES = typer.Option(
    None,
    help="Query x gallery score matrix (.npy memory-mapped, .npz, or the QB-Norm authors' .pkl), evaluated with --truth.",
    rich_help_panel=SCORES,
)
SIDECAR = typer.Option(
    None,
    "--attached",
    help="An attached collection's sidecar (hubless attach), searched with --queries and measured against exact search.",
    rich_help_panel=ATTACHED,
)
CANDIDATES = typer.Option(None, help="The first k' plain candidates per query (default 8 x k).", rich_help_panel=ATTACHED)
MAX_CANDIDATES = typer.Option(None, help="The largest k' an uncertified query is widened to.", rich_help_panel=ATTACHED)
NPROBE = typer.Option(None, help="IVF partitions the store probes (FAISS IVF, LanceDB).", rich_help_panel=ATTACHED)
EF_SEARCH = typer.Option(None, help="The store's HNSW beam (FAISS HNSW, Qdrant, pgvector, Milvus).", rich_help_panel=ATTACHED)
WEIGHT = typer.Option(None, help="The correction's weight (NNN's alpha, DN's lambda).", rich_help_panel=ATTACHED)

# ----------------------------------------------------------------------------------- hubless tune
TUNE_GALLERY = typer.Option(None, help="Gallery embeddings (.npy/.npz).", rich_help_panel=EMBEDDINGS)
VALIDATION_QUERIES = typer.Option(
    None, help="Validation queries: disjoint from the test queries and the query bank (checked).", rich_help_panel=VALIDATION
)
VALIDATION_TRUTH = typer.Option(
    ..., help="Relevant gallery ids of each validation query (.npy/.json or t2i:5 / i2t:5).", rich_help_panel=VALIDATION
)
VALIDATION_GALLERY = typer.Option(None, help="Gallery the validation queries search (default: --gallery).", rich_help_panel=VALIDATION)
TEST_QUERIES = typer.Option(
    None,
    help="Test queries: checked for overlap, then evaluated with the chosen parameters when --truth is given.",
    rich_help_panel=EMBEDDINGS,
)
TEST_TRUTH = typer.Option(None, help="Relevant gallery ids of each test query (also with --scores).", rich_help_panel=EMBEDDINGS)
TUNE_QUERY_BANK = typer.Option(
    None,
    help="Reference queries the corrections are fitted on; repeat as NAME=PATH to tune and test with several banks "
    "(needs --queries and --truth; a table per bank and the geometric mean over banks).",
    rich_help_panel=EMBEDDINGS,
)
TUNE_METHODS = typer.Option(
    ["nnn"],
    "--method",
    "-m",
    help="Method name to tune, repeatable, e.g. nnn (grids from the papers; `hubless methods` lists them).",
    rich_help_panel=MEASURES,
)
OBJECTIVE = typer.Option("R@1", help="Metric to maximise (R@K, MRR, mAP@R) or minimise (MdR, MnR).", rich_help_panel=MEASURES)
TEST_BOOTSTRAP = typer.Option(1000, help="Bootstrap resamples for the test evaluation.", rich_help_panel=MEASURES)
TUNE_OUT = typer.Option(None, help="Write the choice, validation tables and test results as JSON.", rich_help_panel=OUTPUT)
TUNE_REPORT = typer.Option(None, help="Write an HTML report (grid heat maps, tables).", rich_help_panel=OUTPUT)
VALIDATION_SCORES = typer.Option(
    None,
    help="Validation queries x gallery scores (.npy/.npz/.pkl), disjoint from the test and bank rows.",
    rich_help_panel=SCORES,
)
VALIDATION_QUERY_BANK_SCORES = typer.Option(
    None, help="With --validation-scores over another gallery than --scores: the query bank's scores over it.", rich_help_panel=SCORES
)
VALIDATION_GALLERY_BANK_SCORES = typer.Option(
    None, help="Likewise the gallery bank's scores over the validation gallery.", rich_help_panel=SCORES
)
VALIDATION_QUERY_MASK = typer.Option(None, help="With --validation-scores: its padding rows (see --query-mask).", rich_help_panel=SCORES)
TUNE_SCORES = typer.Option(
    None, help="With --validation-scores: test queries x gallery scores, evaluated with --truth.", rich_help_panel=SCORES
)
