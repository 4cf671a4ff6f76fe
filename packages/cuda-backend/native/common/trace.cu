// Device timeline rings (NERVA_TRACE builds): allocated at the first launch (before any graph
// capture), handed to every translation unit's symbols, written to NERVA_DEVICE_TRACE by
// nerva_trace_dump.
#include <stdio.h>

#include <vector>

#include "common/knobs.h"
#include "common/trace.cuh"
#include "nerva.h"

#ifdef NERVA_TRACE
namespace nerva::trace {
namespace {
constexpr unsigned TRACE_CAP = 8192;  // records a SM keeps (the newest)
constexpr unsigned TRACE_SMS = 256;
unsigned long long* traceBuf = nullptr;
unsigned* traceCount = nullptr;
using Setter = void (*)(unsigned long long*, unsigned*, unsigned);
std::vector<Setter>& setters() {
  static std::vector<Setter> v;
  return v;
}
}  // namespace

int registerModule(Setter set) {
  setters().push_back(set);
  return (int)setters().size();
}

void init() {
  if (traceBuf) return;
  cudaMalloc(&traceBuf, (size_t)TRACE_SMS * TRACE_CAP * 6 * 8);
  cudaMalloc(&traceCount, TRACE_SMS * 4);
  cudaMemset(traceCount, 0, TRACE_SMS * 4);
  cudaMemset(traceBuf, 0, (size_t)TRACE_SMS * TRACE_CAP * 6 * 8);
  for (Setter s : setters()) s(traceBuf, traceCount, TRACE_CAP);
  cudaDeviceSynchronize();
}

void dump() {
  const char* path = nerva::knobs::textValue("NERVA_DEVICE_TRACE");
  if (!traceBuf || !path || !*path) return;
  cudaDeviceSynchronize();
  std::vector<unsigned long long> recs((size_t)TRACE_SMS * TRACE_CAP * 6);
  std::vector<unsigned> counts(TRACE_SMS);
  cudaMemcpy(recs.data(), traceBuf, recs.size() * 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(counts.data(), traceCount, TRACE_SMS * 4, cudaMemcpyDeviceToHost);
  FILE* f = fopen(path, "wb");
  if (!f) return;
  fwrite(&TRACE_CAP, 4, 1, f);
  fwrite(counts.data(), 4, TRACE_SMS, f);
  fwrite(recs.data(), 8, recs.size(), f);
  fclose(f);
  fprintf(stderr, "[nerva] device trace written to %s\n", path);
}
}  // namespace nerva::trace
#endif

void nerva_trace_dump() {
#ifdef NERVA_TRACE
  nerva::trace::dump();
#endif
}
