"""The file formats below every other package: array files (``.npy``, ``.npz``, clip-retrieval
folders), sharded embedding sources read by row range, and checked work files (arrays and
records kept by their key and sha256, reused by reruns).

Nothing here imports a hubless package above ``hubless.errors``, ``hubless._validation`` and
``hubless._atomic``: the inputs, the encoders and the distributed jobs all build on it.
"""
