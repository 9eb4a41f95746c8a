// Reading a few members of a JSON text as nlohmann parses it (its SAX
// interface), without building the document: what the gateway reads of a
// stream's events cost less this way than the document it took before.
//
// This keeps the stack of open objects and arrays and says what each value
// is to the reader (its Role); the reader (Derived, CRTP) names the roles and
// reads the values it wants. Role is an enum with kOther (= Role{}, nothing
// the reader wants) and kDocument (the text's own value). Derived provides:
//
//   Role Member(Role object, const std::string& key)
//       a key met in an object of that role: its value's role (and whatever
//       an earlier value of the same key said is undone here: a parsed
//       document keeps the last of a duplicate key)
//   Role Opened(Role at, bool object)
//       an object (or array) opened where a value of role `at` goes: the
//       role of the container, which Member and Element are asked with
//   and, where it wants them (each has a default that reads nothing):
//   Role Element(Role array, size_t index) const     an array's element's role
//   void Closed(Role container, size_t values)       a container closed, with its arrays' element count
//   void String(Role at, const std::string&); void Integer(Role at, int64_t);
//   void Unsigned(Role at, uint64_t); void Float(Role at, double)
//
// A text that does not parse makes json::sax_parse return false; what was
// read of it then means nothing.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spillway {

template <typename Derived, typename Role>
class JsonMembers : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return Read(); }
  bool boolean(bool) override { return Read(); }
  bool number_integer(number_integer_t v) override {
    self().Integer(Here(), v);
    return Read();
  }
  bool number_unsigned(number_unsigned_t v) override {
    self().Unsigned(Here(), v);
    return Read();
  }
  bool number_float(number_float_t v, const string_t&) override {
    self().Float(Here(), v);
    return Read();
  }
  bool string(string_t& s) override {
    self().String(Here(), s);
    return Read();
  }
  bool binary(binary_t&) override { return Read(); }
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    f.next = self().Member(f.role, k);
    return true;
  }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

  // The defaults: nothing read.
  Role Element(Role, size_t) const { return Role{}; }
  void Closed(Role, size_t) {}
  void String(Role, const std::string&) {}
  void Integer(Role, int64_t) {}
  void Unsigned(Role, uint64_t) {}
  void Float(Role, double) {}

 private:
  struct Frame {
    bool object;
    Role role;     // what the container is
    Role next;     // (an object) what its current key's value is
    size_t count;  // (an array) its elements so far
  };
  Derived& self() { return static_cast<Derived&>(*this); }
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  // The role of the value about to be read.
  Role Here() const {
    if (stack_.empty()) return Role::kDocument;
    const Frame& f = stack_.back();
    return f.object ? f.next : self().Element(f.role, f.count);
  }
  // A value was read: an array counts it.
  bool Read() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().count;
    return true;
  }
  bool Open(bool object) {
    const Role inside = self().Opened(Here(), object);
    Read();
    stack_.push_back({object, inside, Role{}, 0});
    return true;
  }
  bool Close() {
    self().Closed(stack_.back().role, stack_.back().count);
    stack_.pop_back();
    return true;
  }

  std::vector<Frame> stack_;
};

}  // namespace spillway
