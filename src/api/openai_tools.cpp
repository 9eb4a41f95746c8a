#include "api/openai_tools.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "api/json_limits.h"
#include "api/json_member.h"

namespace spillway::api {

using nlohmann::json;

namespace {

Status Bad(const std::string& field, const std::string& what) {
  return Status::InvalidArgument("'" + field + "' " + what);
}

// A function's "parameters": a JSON Schema object whose top-level properties
// are objects themselves (the worker's grammar reads their "type").
Status ParseSchema(const json& p, const std::string& field, std::string* out) {
  if (!p.is_object()) return Bad(field, "must be a JSON Schema object");
  if (auto t = p.find("type"); t != p.end() && !(t->is_string() && *t == "object")) {
    return Bad(field + ".type", "must be 'object'");
  }
  if (const json* props = GivenMember(p, "properties")) {
    if (!props->is_object()) return Bad(field + ".properties", "must be an object");
    if (props->size() > kMaxToolProperties) {
      return Bad(field + ".properties", "has more than " + std::to_string(kMaxToolProperties) + " entries");
    }
    for (const auto& [name, schema] : props->items()) {
      if (name.empty() || name.size() > 256) return Bad(field + ".properties", "names must be 1 to 256 bytes");
      if (!schema.is_object()) return Bad(field + ".properties." + name, "must be an object");
    }
  }
  if (const json* req = GivenMember(p, "required")) {
    if (!req->is_array()) return Bad(field + ".required", "must be an array of property names");
    for (const auto& n : *req) {
      if (!n.is_string()) return Bad(field + ".required", "must be an array of property names");
    }
  }
  *out = p.dump(-1, ' ', false, json::error_handler_t::replace);
  if (out->size() > kMaxToolParameters) return Bad(field, "is larger than " + std::to_string(kMaxToolParameters) + " bytes");
  return Status::Ok();
}

Status ParseTool(const json& t, const std::string& field, ToolFunction* out) {
  if (!t.is_object()) return Bad(field, "must be an object");
  auto type = t.find("type");
  if (type == t.end() || !type->is_string() || *type != "function") return Bad(field + ".type", "must be 'function'");
  auto fn = t.find("function");
  if (fn == t.end() || !fn->is_object()) return Bad(field + ".function", "must be an object");
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || !ValidFunctionName(name->get_ref<const std::string&>())) {
    return Bad(field + ".function.name", "must match [A-Za-z0-9_.-]{1,64}");
  }
  out->name = name->get<std::string>();
  if (const json* d = GivenMember(*fn, "description")) {
    if (!d->is_string()) return Bad(field + ".function.description", "must be a string");
    if (d->get_ref<const std::string&>().size() > kMaxToolDescription) {
      return Bad(field + ".function.description", "is longer than " + std::to_string(kMaxToolDescription) + " bytes");
    }
    out->description = d->get<std::string>();
  }
  if (const json* p = GivenMember(*fn, "parameters")) {
    SPILLWAY_RETURN_IF_ERROR(ParseSchema(*p, field + ".function.parameters", &out->parameters));
  }
  return Status::Ok();
}

Status ParseToolChoice(const json& c, ChatRequest* r) {
  static const char* kShape =
      "must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}";
  if (c.is_string()) {
    if (c == "none") r->tool_choice = ToolChoice::kNone;
    else if (c == "auto") r->tool_choice = ToolChoice::kAuto;
    else if (c == "required") r->tool_choice = ToolChoice::kRequired;
    else return Bad("tool_choice", kShape);
  } else if (c.is_object()) {
    auto type = c.find("type");
    auto fn = c.find("function");
    if (type == c.end() || *type != "function" || fn == c.end() || !fn->is_object()) return Bad("tool_choice", kShape);
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) return Bad("tool_choice.function.name", "must be a string");
    r->tool_choice = ToolChoice::kFunction;
    r->tool_choice_name = name->get<std::string>();
    bool known = false;
    for (const auto& t : r->tools) known = known || t.name == r->tool_choice_name;
    if (!known) return Bad("tool_choice.function.name", "names '" + r->tool_choice_name.substr(0, 64) + "', which is not in 'tools'");
  } else {
    return Bad("tool_choice", kShape);
  }
  if (r->tools.empty() && (r->tool_choice == ToolChoice::kRequired || r->tool_choice == ToolChoice::kFunction)) {
    return Bad("tool_choice", "forces a call, which needs 'tools'");
  }
  return Status::Ok();
}

// Removes `object`'s null members but those named in `keep`; whether any went.
bool DropNulls(json* object, std::initializer_list<const char*> keep = {}) {
  if (!object->is_object()) return false;
  bool changed = false;
  for (auto it = object->begin(); it != object->end();) {
    const bool kept = std::any_of(keep.begin(), keep.end(), [&](const char* k) { return it.key() == k; });
    if (it->is_null() && !kept) {
      it = object->erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  return changed;
}

}  // namespace

bool NormalizeChatForWorker(json* body) {
  bool changed = false;
  if (auto m = body->find("messages"); m != body->end() && m->is_array()) {
    for (auto& msg : *m) {
      changed |= DropNulls(&msg, {"content"});  // (null content beside tool calls is meaningful)
      auto calls = msg.is_object() ? msg.find("tool_calls") : msg.end();
      if (!msg.is_object() || calls == msg.end() || !calls->is_array()) continue;
      for (auto& call : *calls) {
        changed |= DropNulls(&call);
        if (!call.is_object()) continue;
        if (!call.contains("type")) {
          call["type"] = "function";
          changed = true;
        }
        if (auto f = call.find("function"); f != call.end() && f->is_object()) {
          changed |= DropNulls(&*f);
          if (!f->contains("arguments")) {
            (*f)["arguments"] = "{}";
            changed = true;
          }
        }
      }
    }
  }
  if (auto t = body->find("tools"); t != body->end() && t->is_array()) {
    for (auto& tool : *t) {
      if (auto f = tool.is_object() ? tool.find("function") : tool.end(); tool.is_object() && f != tool.end()) {
        changed |= DropNulls(&*f);
      }
    }
  }
  return changed;
}

bool ValidFunctionName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  }
  return true;
}

Status ParseToolFields(const json& body, ChatRequest* r) {
  if (const json* it = GivenMember(body, "tools")) {
    if (!it->is_array()) return Bad("tools", "must be an array");
    if (it->size() > kMaxTools) return Bad("tools", "has more than " + std::to_string(kMaxTools) + " entries");
    std::set<std::string> names;
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string field = "tools[" + std::to_string(i) + "]";
      ToolFunction f;
      SPILLWAY_RETURN_IF_ERROR(ParseTool((*it)[i], field, &f));
      if (!names.insert(f.name).second) return Bad(field + ".function.name", "repeats '" + f.name + "'");
      r->tools.push_back(std::move(f));
    }
  }
  r->tool_choice = r->tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (const json* it = GivenMember(body, "tool_choice")) {
    SPILLWAY_RETURN_IF_ERROR(ParseToolChoice(*it, r));
  }
  if (const json* it = GivenMember(body, "parallel_tool_calls")) {
    if (!it->is_boolean()) return Bad("parallel_tool_calls", "must be a boolean");
    r->parallel_tool_calls = it->get<bool>();
  }
  const bool forced = r->tool_choice == ToolChoice::kRequired || r->tool_choice == ToolChoice::kFunction;
  if (forced && r->gen.ignore_eos) return Bad("ignore_eos", "cannot be combined with a tool_choice that forces a call");
  return Status::Ok();
}

Status ParseMessageToolFields(const json& m, const std::string& field, ChatMessage* msg) {
  // Not read here, but the worker's chat layer reads them as strings (and
  // refused another type only once the request was admitted).
  for (const char* k : {"name", "reasoning_content"}) {
    if (const json* v = GivenMember(m, k); v && !v->is_string()) return Bad(field + "." + k, "must be a string");
  }
  if (const json* id = GivenMember(m, "tool_call_id")) {
    if (!id->is_string() || id->get_ref<const std::string&>().size() > 256) {
      return Bad(field + ".tool_call_id", "must be a string of at most 256 bytes");
    }
    msg->tool_call_id = id->get<std::string>();
  }
  const json* calls = GivenMember(m, "tool_calls");
  if (!calls) return Status::Ok();
  if (msg->role != "assistant") return Bad(field + ".tool_calls", "is only allowed on assistant messages");
  if (!calls->is_array()) return Bad(field + ".tool_calls", "must be an array");
  if (calls->size() > kMaxToolCallsPerMessage) {
    return Bad(field + ".tool_calls", "has more than " + std::to_string(kMaxToolCallsPerMessage) + " entries");
  }
  for (size_t i = 0; i < calls->size(); ++i) {
    const std::string f = field + ".tool_calls[" + std::to_string(i) + "]";
    const json& c = (*calls)[i];
    if (!c.is_object()) return Bad(f, "must be an object");
    if (auto type = c.find("type"); type != c.end() && !type->is_null() && *type != "function") {
      return Bad(f + ".type", "must be 'function'");
    }
    ToolCall call;
    if (const json* id = GivenMember(c, "id")) {
      if (!id->is_string() || id->get_ref<const std::string&>().size() > 256) {
        return Bad(f + ".id", "must be a string of at most 256 bytes");
      }
      call.id = id->get<std::string>();
    }
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return Bad(f + ".function", "must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty() ||
        name->get_ref<const std::string&>().size() > 256) {
      return Bad(f + ".function.name", "must be a non-empty string of at most 256 bytes");
    }
    call.name = name->get<std::string>();
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();
    } else if (args->is_object()) {
      call.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    } else {
      return Bad(f + ".function.arguments", "must be a string of JSON");
    }
    if (call.arguments.size() > kMaxToolArguments) {
      return Bad(f + ".function.arguments", "is larger than " + std::to_string(kMaxToolArguments) + " bytes");
    }
    // The worker parses the arguments to put them in the prompt: bounded like a body.
    if (std::string why; CheckJsonLimits(call.arguments, JsonLimits{}, &why) == JsonShape::kTooLarge) {
      return Bad(f + ".function.arguments", why);
    }
    msg->tool_calls.push_back(std::move(call));
  }
  return Status::Ok();
}

}  // namespace spillway::api
