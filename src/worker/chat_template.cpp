#include "worker/chat_template.h"

#include <chat.h>
#include <common.h>
#include <json-schema-to-grammar.h>
#include <llama.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <regex>

namespace spillway::worker {

namespace {

common_json ToCommon(const nlohmann::json& j) {
  return common_json::parse(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

common_chat_tool_choice ToolChoiceOf(api::ToolChoice c) {
  switch (c) {
    case api::ToolChoice::kNone: return COMMON_CHAT_TOOL_CHOICE_NONE;
    case api::ToolChoice::kAuto: return COMMON_CHAT_TOOL_CHOICE_AUTO;
    default: return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
  }
}

// The schema a response_format asks for; "" for text. json_object without a
// schema asks for any object.
std::string SchemaOf(const api::ResponseFormat& f) {
  if (f.type == api::ResponseFormatType::kText) return "";
  if (!f.schema.empty()) return f.schema;
  return R"({"type":"object"})";
}

// llama-server's conversion of a chat template's triggers (server-schema.cpp,
// common_sampler_init): a trigger word that is one token is a token trigger.
void AddTriggers(const common_chat_params& p, const llama_vocab* vocab, GrammarSpec* g) {
  for (const auto& t : p.grammar_triggers) {
    switch (t.type) {
      case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: {
        auto ids = common_tokenize(vocab, t.value, false, true);
        if (ids.size() == 1) {
          g->trigger_tokens.push_back(ids[0]);
        } else {
          g->trigger_patterns.push_back(regex_escape(t.value));
        }
        break;
      }
      case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
        g->trigger_patterns.push_back(t.value);
        break;
      case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
        const auto& v = t.value;
        g->trigger_patterns.push_back(v.empty() ? "^$" : (v.front() != '^' ? "^" : "") + v + (v.back() != '$' ? "$" : ""));
        break;
      }
      case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:
        g->trigger_tokens.push_back(t.token);
        break;
    }
  }
}

// `text` as a GBNF string literal's inside (json-schema-to-grammar's escapes).
std::string GbnfEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default: out += c;
    }
  }
  return out;
}

// An eager chat grammar starts with the generation prompt, which the
// template already put at the end of the prompt. llama-server feeds its
// tokens to the grammar first (common_sampler_init's prefill): done the same
// way when those tokens spell it exactly. When they do not (a vocabulary
// without the template's special tokens: SPM joins the marker's "<" to a
// space, and llama-server's prefill then fails the request), the literal is
// taken off the grammar's root instead: the same constraint on what follows.
void Prefill(const std::string& generation_prompt, const llama_vocab* vocab, GrammarSpec* g) {
  if (generation_prompt.empty()) return;
  auto tokens = common_tokenize(vocab, generation_prompt, false, true);
  std::string spelled;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string piece = common_token_to_piece(vocab, tokens[i], true);
    if (i == 0 && !piece.empty() && std::isspace(static_cast<unsigned char>(piece[0])) &&
        !std::isspace(static_cast<unsigned char>(generation_prompt[0]))) {
      continue;  // a tokenizer's leading space before a special token
    }
    spelled += piece;
    g->prefill.push_back(tokens[i]);
  }
  if (spelled == generation_prompt) return;
  g->prefill.clear();
  const std::string head = "root ::= \"" + GbnfEscape(generation_prompt) + "\"";
  size_t at = std::string::npos;
  if (g->gbnf.compare(0, head.size(), head) == 0) {
    at = 0;
  } else if (size_t nl = g->gbnf.find("\n" + head); nl != std::string::npos) {
    at = nl + 1;
  }
  if (at == std::string::npos) return;
  const size_t n = head.size() + (g->gbnf.compare(at + head.size(), 1, " ") == 0 ? 1 : 0);
  g->gbnf.replace(at, n, "root ::= ");
}

// tool_choice "required" or a named function: llama.cpp's grammar lets the
// model write free text before the call (`until-N?` in front of the calls in
// the root rule), so a reluctant model, or a random one, may never call.
// Spillway's forced call is a call: that allowance is taken out.
void ForceCallFirst(std::string* gbnf) {
  static const std::regex kContentBeforeCalls(R"( until-[0-9]+\?(?= tool-calls?\b))");
  const size_t root = gbnf->compare(0, 9, "root ::= ") == 0 ? 0 : gbnf->find("\nroot ::= ");
  if (root == std::string::npos) return;
  const size_t begin = root == 0 ? 0 : root + 1;
  const size_t end = std::min(gbnf->find('\n', begin), gbnf->size());
  const std::string line = std::regex_replace(gbnf->substr(begin, end - begin), kContentBeforeCalls, "");
  gbnf->replace(begin, end - begin, line);
}

// parallel_tool_calls false: formats whose calls each have their own markers
// (Hermes, Qwen: <tool_call>...</tool_call>) get a grammar for one or more
// calls from llama.cpp whatever the flag says; Spillway allows exactly one.
// (By hand, not std::regex: libstdc++'s matcher recurses once per character
// a `.*` takes, and the rule of 128 tools is a line long enough to overflow
// the stack.)
void OneCallOnly(std::string* gbnf) {
  static const std::string kHead = "tool-calls ::= (";
  size_t at = gbnf->compare(0, kHead.size(), kHead) == 0 ? 0 : gbnf->find("\n" + kHead);
  if (at == std::string::npos) return;
  if (at != 0) ++at;  // (past the newline)
  const size_t end = std::min(gbnf->find('\n', at), gbnf->size());
  const size_t inner = at + kHead.size();
  if (end < inner + 2 || gbnf->compare(end - 2, 2, ")+") != 0) return;  // not "( ... )+"
  gbnf->replace(at, end - at, "tool-calls ::= " + gbnf->substr(inner, end - 2 - inner));
}

}  // namespace

ChatTemplates::~ChatTemplates() {
  if (tmpls_) common_chat_templates_free(tmpls_);
}

StatusOr<std::unique_ptr<ChatTemplates>> ChatTemplates::ForModel(const llama_model* model) {
  std::unique_ptr<ChatTemplates> t(new ChatTemplates());
  t->model_ = model;
  try {
    t->tmpls_ = common_chat_templates_init(model, "").release();
  } catch (const std::exception& e) {
    // llama-server refuses to start; a worker keeps serving with ChatML and says why.
    std::fprintf(stderr, "spillway-worker: the model's chat template cannot be used (%s); using ChatML\n", e.what());
    try {
      t->tmpls_ = common_chat_templates_init(model, "chatml").release();
    } catch (const std::exception& e2) {
      return Status::Internal(std::string("no chat template could be prepared: ") + e2.what());
    }
  }
  t->source_ = common_chat_templates_source(t->tmpls_);
  const auto caps = common_chat_templates_get_caps(t->tmpls_);
  auto it = caps.find("supports_parallel_tool_calls");
  t->parallel_calls_ = it != caps.end() && it->second;
  try {
    t->thinking_ = common_chat_templates_support_enable_thinking(t->tmpls_);
  } catch (const std::exception&) {
    t->thinking_ = false;  // (a template that cannot render a plain chat says so at each request's rendering)
  }
  return t;
}

StatusOr<ChatPlan> ChatTemplates::Render(const nlohmann::json& messages, const nlohmann::json& tools,
                                         const api::ChatRequest& r) const {
  const llama_vocab* vocab = llama_model_get_vocab(model_);
  ChatPlan plan;
  try {
    common_chat_templates_inputs in;
    in.messages = common_chat_msgs_parse_oaicompat(ToCommon(messages));
    if (tools.is_array() && !tools.empty()) in.tools = common_chat_tools_parse_oaicompat(ToCommon(tools));
    in.tool_choice = ToolChoiceOf(r.tool_choice);
    in.parallel_tool_calls = r.parallel_tool_calls.value_or(parallel_calls_);
    in.json_schema = SchemaOf(r.gen.response_format);
    in.use_jinja = true;
    in.add_generation_prompt = true;
    // llama-server's prefill_assistant: a trailing assistant message is continued.
    if (!in.messages.empty() && in.messages.back().role == "assistant") {
      if (in.messages.size() >= 2 && in.messages[in.messages.size() - 2].role == "assistant") {
        return Status::InvalidArgument("'messages' cannot end with two or more assistant messages");
      }
      if (!in.messages.back().tool_calls.empty()) {
        return Status::InvalidArgument("'messages' cannot end with an assistant message that holds tool calls "
                                       "(it would be continued): add the tool results");
      }
      in.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
      in.add_generation_prompt = false;
    }
    in.reasoning_format = r.reasoning_format.empty() ? COMMON_REASONING_FORMAT_DEEPSEEK
                                                     : common_reasoning_format_from_name(r.reasoning_format);
    in.enable_thinking = thinking_;
    in.chat_template_kwargs["preserve_reasoning"] = "true";  // llama-server's default
    for (const auto& [k, v] : r.chat_template_kwargs) in.chat_template_kwargs[k] = v;
    if (auto k = in.chat_template_kwargs.find("enable_thinking"); k != in.chat_template_kwargs.end()) {
      in.enable_thinking = k->second == "true";
    }
    if (r.reasoning_effort == "none") {
      in.enable_thinking = false;
      in.chat_template_kwargs.erase("reasoning_effort");
    } else if (!r.reasoning_effort.empty()) {
      in.chat_template_kwargs["reasoning_effort"] = nlohmann::json(r.reasoning_effort).dump();
    }

    const common_chat_params p = common_chat_templates_apply(tmpls_, in);
    plan.prompt = p.prompt;
    plan.stops = p.additional_stops;
    for (const auto& t : p.preserved_tokens) {
      auto ids = common_tokenize(vocab, t, false, true);
      if (ids.size() == 1) plan.preserved_tokens.push_back(ids[0]);
    }
    std::sort(plan.preserved_tokens.begin(), plan.preserved_tokens.end());

    // A named function: the prompt offers every tool, the grammar only that one.
    common_chat_params forced = p;
    if (r.tool_choice == api::ToolChoice::kFunction) {
      common_chat_templates_inputs only = in;
      only.tools.clear();
      for (const auto& t : in.tools) {
        if (t.name == r.tool_choice_name) only.tools.push_back(t);
      }
      forced = common_chat_templates_apply(tmpls_, only);
    }
    plan.grammar.gbnf = forced.grammar;
    plan.grammar.lazy = forced.grammar_lazy;
    if (in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && !in.tools.empty()) ForceCallFirst(&plan.grammar.gbnf);
    if (!in.parallel_tool_calls) OneCallOnly(&plan.grammar.gbnf);
    if (forced.grammar_lazy) AddTriggers(forced, vocab, &plan.grammar);
    if (!forced.grammar.empty() && !forced.grammar_lazy) Prefill(p.generation_prompt, vocab, &plan.grammar);
    if (plan.grammar.lazy && plan.grammar.trigger_patterns.empty() && plan.grammar.trigger_tokens.empty()) {
      plan.grammar = GrammarSpec{};  // llama-server refuses a lazy grammar without triggers; nothing to wait for
    }

    auto syntax = std::make_shared<common_chat_parser_params>(p);
    syntax->reasoning_format = in.reasoning_format;
    // llama-server: deepseek-legacy streams the reasoning inline, in <think> tags.
    syntax->reasoning_in_content = r.gen.stream && in.reasoning_format == COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY;
    syntax->parse_tool_calls = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    if (!p.parser.empty()) syntax->parser.load(p.parser);
    plan.syntax.params = std::move(syntax);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("the chat template could not render this request: ") + e.what());
  }
  return plan;
}

StatusOr<GrammarSpec> ResponseFormatGrammar(const api::ResponseFormat& f) {
  GrammarSpec g;
  const std::string schema = SchemaOf(f);
  if (schema.empty()) return g;
  try {
    g.gbnf = json_schema_to_grammar(common_json::parse(schema));
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("'response_format' schema cannot be turned into a grammar: ") + e.what());
  }
  return g;
}

}  // namespace spillway::worker
