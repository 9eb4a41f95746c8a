// A GBNF grammar's repetitions {m,n} checked before llama.cpp parses it.
//
// llama.cpp's grammar parser (llama-grammar.cpp, handle_repetitions) counts
// the optional copies of a repeated item as max - min, unsigned: a
// repetition whose maximum is below its minimum ({10,1}, from a JSON schema
// with minLength 10 and maxLength 1, minItems above maxItems, or a pattern
// `a{10,1}`) wraps to about 1.8e19 copies, and the worker allocates rules
// until the host's memory runs out (a cancel or a deadline does not stop
// it: the parse runs before the request does). No text matches such a
// repetition anyway: it is refused as the client's mistake.
//
// Pure: reads the grammar's text only.
#pragma once

#include <string_view>

#include "common/status.h"

namespace spillway::worker {

// InvalidArgument naming the first repetition whose maximum is below its
// minimum; Ok otherwise (string literals, character classes and comments
// are skipped: a '{' in them is text).
Status CheckRepetitionBounds(std::string_view gbnf);

}  // namespace spillway::worker
