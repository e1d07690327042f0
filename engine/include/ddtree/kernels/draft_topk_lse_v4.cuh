// draft_topk_lse v4: ONE launch per call, for k <= 64 on sm_90+ (thread-block clusters).
//
// Why (engine/bench/NOTES.md, "v4"): v3 spends ~37 instructions per logit in phase 1 and its merge is a
// second, latency-bound launch (5-9 µs on 15 SMs). v4 gives each row one cluster of up to 8 CTAs
// (grid = (cluster, rows)); CTA c reduces a contiguous slice of the row and writes its partial
// (log2-domain max, sum) and its best min(k, n) items straight into the shared memory of the cluster's
// CTA 0 (distributed shared memory); after one cluster barrier CTA 0 merges and writes the outputs.
// No workspace, no tickets, no second kernel, nothing to initialize: the cluster barrier is the
// "last CTA" signal, so CUDA-graph replays and concurrent calls on other streams need no care.
//
// Per CTA (THREADS = 512, <= 64 registers: 2 CTAs per SM; a 15 x 163,840 bf16 call is 120 CTAs). v5
// (NOTES, "v5 (session 3)") changed steps 1-3 and the merge as marked:
//   1. all 16-byte loads of a round (kV4Vecs per thread) issued first; bf16 pairs maxed packed
//      (max.bf16x2: 0.5 instruction per logit); v5: each thread sums exp2(fma(x, log2 e, -ref)) against
//      its first finite vector maximum (~4 instructions per logit: unpack, FFMA, MUFU, FADD), the warp
//      combines the lanes' (ref, sum) once. NaN or +inf make the sum NaN (checked once per CTA).
//   2. a lower bound on the slice's k-th largest key: the k-th largest of the 128 lane-group maxima
//      (k groups hold k distinct logits >= it; k = 1: their maximum). Selection keys read -0 as +0.
//   3. v5: k = 1: each lane whose maximum reaches the bound keeps its best item (one atomicMax). k > 1: a
//      warp looks at vector j only when a lane's vector j reaches the bound; branch-free bit masks, eight
//      ballots and ONE atomicAdd per (warp, vector) append the logits >= it (about 17 per CTA for k = 16,
//      90 for k = 64); exact ranks by counting (items are distinct (key, id) pairs); ranks < k go into
//      CTA 0's slot for this CTA, sorted. More than kV4Cap candidates (tie-heavy slices): the block radix
//      select of v2 over the re-read slice (exact, slower).
//   CTA 0 (v5): once every CTA's bytes landed (st.async + mbarrier, the default; or a closing cluster
//   barrier), every warp computes the lse from the partials and every slot item its row rank (its index
//   plus a binary search in each other CTA's sorted slot); ranks < k are written as x - lse.
// v6 (NOTES, "v6 (session 4)"; OPT = kV4OptDefault): unconditional loads for CTAs inside the row, and k = 1
// without steps 2-3: per-warp best items, warp 15 sends the CTA's, CTA 0's warp 15 merges alone (1x15 x
// 163,840: 8.4 -> 5.4 µs). The opt-in k > 1 options (kV4OptRadixBound, RolledVisit, SplitMerge) and the
// STOP / DDTREE_V4_MARK hooks are for bench/profile/draft_topk_lse_stages.cu.
// v7 (NOTES, "v7 (session 5)", from an ncu source-level profile): k > 1 with the bound's group-maxima reads
// free of bank conflicts, CTA 0's ranks by eight interleaved branch-free searches, a round's reloads issued
// together, and a float candidate filter (1x15 x 163,840 K = 16: 11.4 -> 8.8 µs; 8x15: 32.7 -> 28.4); v7b:
// the merge's searches only as deep and as wide as k and the cluster need (8x15 K = 16: 27.3 µs).
// v8 (NOTES, "v8 (session 6)"): k > 1 with a bound above -inf's key appends candidates per lane (float compares
// into a bit mask, one shared atomic per lane with hits) instead of per (warp, vector) with eight ballots
// (1x15 x 163,840 K = 16 / 32 / 64: 8.9 / 10.4 / 12.9 -> 8.6 / 9.4 / 11.3 µs; 8x15 K = 64: 36.9 -> 33.8).
// v9 (NOTES "v9 (session 7)"): k > 1 candidates a register round at a time, each vector's maximum tested
// before its mask, one atomic and a set-bit store loop per vector with a hit; every CTA sends its partial and
// sorted items to every CTA of the cluster and ranks its own items, one lane per (item, list) pair (1x15 x
// 163,840 K = 16 / 32 / 64: 8.6 / 9.6 / 11.4 -> 7.5 / 8.5 / 9.4 µs; 8x15: 27.4 / 29.5 / 33.4 -> 24.0 / 26.0 / 28.3;
// separate processes of the Python bench, session 6's final run and session 7's call 2).
// The library runs it where a row gets 4 or more CTAs (bf16 V > 24,576; src/draft_topk_lse.cu).
// v11 (NOTES "v11 (session 8"): v9 with a row bound before the candidate pass (each CTA's ceil(k / cluster)-th largest
// group maximum, exchanged; the smallest bounds the row's k-th item), so a CTA ranks, sends and merges a few candidates
// instead of ~k-2k. The library runs it for k > 32 (and k = 32 with 4-CTA clusters) at clusters of 4+ CTAs (1x15 x
// 163,840 K = 64: 9.0 -> 7.9 µs; 8x15 K = 64: 25.8 -> 23.4); at K = 16 the exchange costs more than it saves.
// v13 (NOTES "v13 (session 9"): the compact builds (kV4OptCompact: one copy of each hot stage, the rare passes rolled
// and, with kV4OptColdCall, called): sm_90a SASS 165 -> 61 KB. In a graph of identical calls (code warm in the SMs'
// instruction caches) v13r = compact v11 is 0.95x of v11 at 8-CTA clusters and the library runs it there for k > 1
// (1x15 x 163,840 K = 32 / 64: 8.3 / 8.7 -> 7.9 / 8.3 µs); with the code cold (a call right after other kernels, as in
// a decoding round) every compact build saves 0.9-2.6 µs against its base.
#pragma once

// Parts: draft_topk_lse_v4/helpers.cuh (configuration, cluster primitives, shared-memory layout, helpers),
// draft_topk_lse_v4/stages.cuh (the kernel's stage functions) and draft_topk_lse_v4/kernel.cuh (the kernel).
#include "ddtree/kernels/draft_topk_lse_v4/kernel.cuh"
