"""Independent brute-force implementations of every correction's formula (float64, loops).

These follow the papers' definitions literally and share no code with hubless, so tests can
check the library against them.
"""

from __future__ import annotations

import numpy as np


def cos(a, b):
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64).T


def topk_mean_bias(gallery, bank, k):
    """NNN/CSLS r_r: for each gallery item, the mean of its k largest similarities to the bank."""
    sims = cos(gallery, bank)
    return np.array([np.sort(row)[::-1][:k].mean() for row in sims])


def nnn(queries, gallery, bank, alpha, k):
    return cos(queries, gallery) - alpha * topk_mean_bias(gallery, bank, k)[None, :]


def csls(queries, gallery, bank, k):
    s = cos(queries, gallery)
    r_q = np.array([np.sort(row)[::-1][:k].mean() for row in s])
    return 2 * s - r_q[:, None] - topk_mean_bias(gallery, bank, k)[None, :]


def dn(queries, gallery, bank, lam, gallery_ref=None):
    mu_b = np.asarray(bank, np.float64).mean(axis=0)
    mu_g = np.asarray(gallery if gallery_ref is None else gallery_ref, np.float64).mean(axis=0)
    return (np.asarray(queries, np.float64) - lam * mu_b) @ (np.asarray(gallery, np.float64) - lam * mu_g).T


def inverted_softmax(queries, gallery, bank, beta):
    s = cos(queries, gallery)
    z = np.exp(beta * cos(bank, gallery)).sum(axis=0)  # per gallery item
    return np.exp(beta * s) / z[None, :]


def activation_set(bank, gallery, k_a):
    """Union over bank items of their k_a nearest gallery items (ties: lower index)."""
    sims = cos(bank, gallery)
    members = set()
    for row in sims:
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))
        members.update(order[:k_a])
    mask = np.zeros(len(gallery), bool)
    mask[list(members)] = True
    return mask


def raw_top1(queries, gallery):
    s = cos(queries, gallery)
    return np.array([min(range(len(row)), key=lambda j: (-row[j], j)) for row in s])


def dynamic_inverted_softmax(queries, gallery, bank, beta, k_a):
    s = cos(queries, gallery)
    gate = activation_set(bank, gallery, k_a)[raw_top1(queries, gallery)]
    return np.where(gate[:, None], inverted_softmax(queries, gallery, bank, beta), s)


def dual_is(queries, gallery, bank, gallery_bank, bq, bg):
    s = cos(queries, gallery)
    zq = np.exp(bq * cos(bank, gallery)).sum(axis=0)
    zg = np.exp(bg * cos(gallery_bank, gallery)).sum(axis=0)
    return (np.exp(bq * s) / zq) * (np.exp(bg * s) / zg)


def dual_dis_published(queries, gallery, bank, gallery_bank, bq, bg, k_a):
    """DualDIS as published (NNN paper appendix A1): a factor whose gate does not fire is s."""
    s = cos(queries, gallery)
    top1 = raw_top1(queries, gallery)
    gate_q = activation_set(bank, gallery, k_a)[top1][:, None]
    gate_g = activation_set(gallery_bank, gallery, k_a)[top1][:, None]
    f_q = np.where(gate_q, np.exp(bq * s) / np.exp(bq * cos(bank, gallery)).sum(axis=0)[None, :], s)
    f_g = np.where(gate_g, np.exp(bg * s) / np.exp(bg * cos(gallery_bank, gallery)).sum(axis=0)[None, :], s)
    return f_q * f_g


def dual_dis(queries, gallery, bank, gallery_bank, bq, bg, k_a):
    """DualDIS with hubless's earlier "exp" form: an ungated factor is exp(beta s)."""
    s = cos(queries, gallery)
    top1 = raw_top1(queries, gallery)
    gate_q = activation_set(bank, gallery, k_a)[top1][:, None]
    gate_g = activation_set(gallery_bank, gallery, k_a)[top1][:, None]
    zq = np.exp(bq * cos(bank, gallery)).sum(axis=0)[None, :]
    zg = np.exp(bg * cos(gallery_bank, gallery)).sum(axis=0)[None, :]
    f_q = np.exp(bq * s) / np.where(gate_q, zq, 1.0)
    f_g = np.exp(bg * s) / np.where(gate_g, zg, 1.0)
    return f_q * f_g


def global_correction(queries, gallery, bank):
    s = cos(queries, gallery)
    probes = cos(bank, gallery)  # (n_bank, n_gallery)
    rank = np.array([[np.sum(probes[:, j] > s[i, j]) for j in range(s.shape[1])] for i in range(s.shape[0])])
    return s - rank


def ranking(scores):
    """Order of each row: descending score, ties by lower index."""
    return np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores), axis=1)


def assert_same_ranking(ids, ref_scores, top_k, *, atol=1e-5):
    """``ids`` (n, top_k) must be a best-first ranking under ``ref_scores`` (n, n_gallery):
    distinct items whose reference scores equal the reference top-k values within ``atol``,
    so only near-ties may be ordered differently from the reference."""
    assert ids.shape == (ref_scores.shape[0], top_k)
    assert all(len(set(row)) == top_k for row in ids.tolist())
    ref_top = np.take_along_axis(ref_scores, ranking(ref_scores)[:, :top_k], axis=1)
    got = np.take_along_axis(ref_scores, ids, axis=1)
    np.testing.assert_allclose(got, ref_top, atol=atol, rtol=0)
