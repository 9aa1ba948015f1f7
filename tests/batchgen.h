/*
 * batchgen.h - the tests' way to the random serving batches of
 * bench/batches.h, together with the test harness.
 */
#ifndef KVA_TEST_BATCHGEN_H
#define KVA_TEST_BATCHGEN_H

#include "../bench/batches.h"
#include "harness.h"

#endif /* KVA_TEST_BATCHGEN_H */
