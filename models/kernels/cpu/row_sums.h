// models/kernels/cpu/row_sums.h: a row's sum in double for the CPU set's norms, in 8 running sums (c mod 8) added
// pairwise at the end: 8 independent chains of additions instead of one, so that a row's sum no longer waits on
// each addition's latency (the norms' one long chain each took 2-3% of a small transformer's CPU step). In double,
// each of these sums of at most a few thousand float products is exact to well below float's last place, whatever
// the order.
#pragma once

#include <cstdint>

namespace dpt::models::cpu_sums {

// sum over c < C of term(c).
template <class F>
double sum8(int64_t C, F&& term) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= C; c += 8)
    for (int l = 0; l < 8; ++l) acc[l] += term(c + l);
  for (int l = 0; c < C; ++c, ++l) acc[l] += term(c);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace dpt::models::cpu_sums
