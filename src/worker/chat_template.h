// Chat prompts through llama.cpp's own chat layer (`common`'s chat.h), with
// the options llama-server uses: the model's jinja template from the GGUF
// (ChatML when it has none), jinja on, the request's tools, tool_choice,
// parallel_tool_calls, reasoning_format and response_format. What comes back
// is everything a generation needs besides the prompt tokens: the grammar
// (lazy with its triggers for tool_choice "auto", eager for "required", a
// named function and response_format), the tokens to render as text
// (preserved tokens), extra stop strings, and the parser for the answer.
//
// Where Spillway deliberately differs from llama-server (README: "Chat
// templates"): a named tool_choice forces that function (llama-server treats
// it as "auto"); response_format json_object without a schema constrains to
// a JSON object (llama-server leaves it free).
//
// Thread contract: a ChatTemplates is immutable after ForModel(); Render()
// may be called from any thread. Errors of the template or of the request
// (common throws) come back as kInvalidArgument.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <vector>

#include "api/openai_request.h"
#include "common/status.h"
#include "worker/chat_output.h"
#include "worker/sampling.h"

struct llama_model;
struct common_chat_templates;

namespace spillway::worker {

// A chat request made ready for the engine.
struct ChatPlan {
  std::string prompt;                    // the rendered template
  GrammarSpec grammar;                   // empty gbnf: free generation
  std::vector<int32_t> preserved_tokens; // sorted; generated as their text (tool-call markers)
  std::vector<std::string> stops;        // the template's extra stop strings
  ChatSyntax syntax;                     // how to read the answer
};

class ChatTemplates {
 public:
  ~ChatTemplates();
  static StatusOr<std::unique_ptr<ChatTemplates>> ForModel(const llama_model* model);

  // `messages` and `tools` are the request's own JSON arrays (null when
  // absent), already checked by api::ParseChatRequest into `r`.
  StatusOr<ChatPlan> Render(const nlohmann::json& messages, const nlohmann::json& tools,
                            const api::ChatRequest& r) const;

  // The template's source (the fingerprint hashes it).
  const std::string& source() const { return source_; }

 private:
  ChatTemplates() = default;
  common_chat_templates* tmpls_ = nullptr;
  const llama_model* model_ = nullptr;
  std::string source_;
  bool parallel_calls_ = false;  // the template's own default for parallel_tool_calls
  // Whether the template thinks when asked (enable_thinking's default), found once when the
  // model loads, as llama-server finds it: llama.cpp renders a chat to tell, which cost each
  // request about a quarter of its rendering when it was asked again every time.
  bool thinking_ = false;
};

// A completion's response_format as a grammar (no template involved).
StatusOr<GrammarSpec> ResponseFormatGrammar(const api::ResponseFormat& f);

}  // namespace spillway::worker
