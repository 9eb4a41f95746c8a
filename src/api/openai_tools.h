// The tool-calling fields of OpenAI chat requests: "tools", "tool_choice" and,
// in the history, assistant "tool_calls" and tool messages' "tool_call_id".
// Called by ParseChatRequest; errors name the field (kInvalidArgument -> 400).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "api/openai_request.h"
#include "common/status.h"

namespace spillway::api {

// Function names: [A-Za-z0-9_.-]{1,64}. OpenAI's rule without the dot;
// with it, as llama-server and vLLM take them: gpt-oss's own tools are
// `browser.search` and `python`, and Ollama clients send such names.
bool ValidFunctionName(std::string_view name);

// Reads "tools" and "tool_choice" into `r` (checks "parallel_tool_calls" is a
// boolean). Call after r->gen is parsed: a forced call excludes ignore_eos.
Status ParseToolFields(const nlohmann::json& body, ChatRequest* r);

// Reads message `m`'s "tool_calls" (assistant) and "tool_call_id" (tool) into
// `msg`; `field` names the message ("messages[3]").
Status ParseMessageToolFields(const nlohmann::json& m, const std::string& field, ChatMessage* msg);

// A chat body as llama.cpp's chat layer (which the worker renders with)
// reads it, meaning what the client meant: null members of messages, tool
// calls and tools' functions dropped (null is "unset" to OpenAI, an error
// there: Pydantic's model_dump() sends them), a history tool call's missing
// "type" made "function" and its missing "arguments" "{}", as Spillway's own
// parser reads them. Call on a body ParseChatRequest accepted; returns
// whether anything changed.
bool NormalizeChatForWorker(nlohmann::json* body);

}  // namespace spillway::api
