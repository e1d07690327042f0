/* libddtree: the whole C ABI. Each op's header declares its launcher (and workspace query, if any);
 * all of them take a cudaStream_t, never synchronize, and are safe to capture in a CUDA graph. */
#ifndef DDTREE_DDTREE_H_
#define DDTREE_DDTREE_H_

#include "ddtree/status.h"
#include "ddtree/draft_topk_lse.h"
#include "ddtree/build_tree.h"
#include "ddtree/tree_attention.h"
#include "ddtree/tree_accept.h"
#include "ddtree/kv_commit.h"
#include "ddtree/round_update.h"
#include "ddtree/round_finish.h"
#include "ddtree/commit_update.h"
#include "ddtree/qkv_prep.h"

#endif /* DDTREE_DDTREE_H_ */
