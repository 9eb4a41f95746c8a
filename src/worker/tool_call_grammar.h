// The GBNF grammar (llama.cpp's grammar sampler, root rule "root") that
// forces exactly one call of one of the given functions, in the format
// ToolCallParser reads:
//
//   <tool_call>\n{"name": "<name>", "arguments": ARGS}\n</tool_call>
//
// ARGS is {} when the function has no parameters or its schema no properties;
// otherwise an object with every property, those in "required" first (in that
// order), then the others by name, each value bounded by its schema's "type":
//   string          "..." of at most 32 characters from [a-zA-Z0-9 _.,:-]
//   integer         at most 9 digits, optional "-"
//   number          an integer with at most 6 decimals
//   boolean         true | false
//   enum (scalars)  one of the listed values
//   anything else   a string as above
// No free whitespace and every repetition bounded, so even a random model ends
// within a few hundred characters; the only token allowed after the closing
// tag is end-of-generation. Pure text, no llama.cpp.
#pragma once

#include <string>
#include <vector>

#include "api/openai_request.h"

namespace spillway::worker {

// `allowed` must not be empty; schemas are those ParseChatRequest accepted.
std::string ToolCallGrammar(const std::vector<api::ToolFunction>& allowed);

// `text` as a GBNF string literal, quotes included.
std::string GbnfLiteral(std::string_view text);

}  // namespace spillway::worker
