// How a chat request's functions ("tools", "tool_choice") shape the prompt,
// the sampler and the answer. Function calling is Hermes style: llama.cpp's
// chat templates only know role and content, so definitions, calls and
// results are written as text the template renders like any message.
//
//   tool_choice  prompt            sampler                  answer
//   none         no definitions    free                     text only
//   auto         definitions       free                     <tool_call> blocks become calls
//   required     definitions       grammar: one call, any   the call
//   {function}   definitions       grammar: that function   the call
//
// Pure logic, no llama.cpp.
#pragma once

#include <string>
#include <vector>

#include "api/openai_request.h"

namespace spillway::worker {

struct ToolUse {
  bool parse_calls = false;        // <tool_call> blocks in the output become tool calls
  std::string grammar;             // GBNF forcing one call (ToolCallGrammar); "" = free text
  std::vector<std::string> names;  // the declared functions
};

ToolUse PlanToolUse(const api::ChatRequest& r);

// The messages for the chat template, role and content only:
// - the function definitions (unless tool_choice is "none") in Hermes'
//   <tools> block, appended to the first system message or as a new one first;
// - an assistant message's calls as <tool_call> blocks after its content;
// - tool results as role "tool" with their content.
std::vector<api::ChatMessage> PromptMessages(const api::ChatRequest& r);

}  // namespace spillway::worker
