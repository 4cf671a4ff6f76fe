// The runtime settings of the native code: every environment name the addon reads is declared
// once in knobs.cc's table (name, default, accepted values, one-line doc). Code reads a knob
// through these functions, never getenv; the addon exposes the table (and each knob's value as
// read) to TypeScript, which checks the environment against it instead of mirroring it.
#pragma once
#include <cstddef>

namespace nerva::knobs {

enum class Kind { Int, OneOf, Path };

struct Knob {
  const char* name;     // "NERVA_HOST_THREADS"
  Kind kind;
  const char* dflt;     // the default as text ("" for none)
  long min, max;        // Kind::Int bounds (inclusive)
  const char* values;   // Kind::OneOf: accepted values, comma-separated ("spin,block,auto")
  const char* doc;      // one line
};

// The table, in declaration order.
const Knob* table(std::size_t* count);

// The knob of that name, or nullptr.
const Knob* find(const char* name);

// A knob's value: the environment's when set, non-empty and valid, else the default. Invalid
// values fall back to the default here; validate() reports them.
long intValue(const char* name);
// OneOf and Path knobs: the value as text (static storage; "" when unset and no default).
const char* textValue(const char* name);

// Checks every knob set in the environment; on the first invalid one writes a message naming
// the variable, the value and what it accepts into `why` and returns false.
bool validate(char* why, std::size_t whyLen);

}  // namespace nerva::knobs
