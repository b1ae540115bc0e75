#include "worker/data/sample_order.h"

#include <set>

#include "tests/catch.h"

using loom::train::microBatchStart;
using loom::train::SampleOrder;

TEST_CASE("sample order: each epoch is a permutation, fixed by the seed", "[train]") {
  SampleOrder a(100, 7), b(100, 7), c(100, 8);
  std::set<int64_t> epoch0, epoch1;
  bool differs = false, epochsDiffer = false;
  for (int64_t p = 0; p < 100; ++p) {
    const int64_t x = a.sampleAt(p);
    epoch0.insert(x);
    CHECK(x == b.sampleAt(p));
    differs |= x != c.sampleAt(p);
  }
  for (int64_t p = 100; p < 200; ++p) {
    epoch1.insert(a.sampleAt(p));
    epochsDiffer |= a.sampleAt(p) != b.sampleAt(p - 100);
  }
  CHECK(epoch0.size() == 100);
  CHECK(epoch1.size() == 100);
  CHECK(differs);
  CHECK(epochsDiffer);
  // Going back to an earlier position gives the same sample (a resumed run).
  SampleOrder d(100, 7);
  CHECK(d.sampleAt(150) == a.sampleAt(150));
  CHECK(d.sampleAt(3) == b.sampleAt(3));
}

TEST_CASE("sample order: the samples of a step do not depend on the number of ranks", "[train]") {
  // train batch 8: 1 rank x 4 micro-batches of 2, or 2 ranks x 2 micro-batches of 2.
  std::multiset<int64_t> one, two;
  for (int64_t m = 0; m < 4; ++m)
    for (int64_t i = 0; i < 2; ++i) one.insert(microBatchStart(3, 8, m, 2, 0, 1) + i);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t i = 0; i < 2; ++i) two.insert(microBatchStart(3, 8, m, 2, r, 2) + i);
  CHECK(one == two);
  CHECK(*one.begin() == 24);
  CHECK(*one.rbegin() == 31);
}
