// zenflow._C's engine configuration for Python: config dicts parsed and printed through the
// engine's configuration table (engine.h: zf_engine_config_key), so that every key, type,
// default and range is the engine's, and the groups argument of Engine(). The engine checks
// every value (zf_engine_config_check); this file only reads Python values into fields.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bind_engine.hpp"
#include "tensor_convert.hpp"
#include "zenflow/engine.h"

namespace zf_py {

double number(py::handle value, const std::string& name) {
  if (PyBool_Check(value.ptr()) || !PyNumber_Check(value.ptr())) {
    throw py::type_error(name + ": expected a number, got " +
                         std::string(py::str(py::type::of(value).attr("__name__"))));
  }
  return py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
}

int64_t integer(py::handle value, const std::string& name) {
  if (PyBool_Check(value.ptr())) throw py::type_error(name + ": expected an integer, got bool");
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    throw py::type_error(name + ": expected an integer, got " +
                         std::string(py::str(py::type::of(value).attr("__name__"))));
  }
  const py::object owned = py::reinterpret_steal<py::object>(index);
  int overflow = 0;
  const long long result = PyLong_AsLongLongAndOverflow(owned.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(name + ": out of range");
  return static_cast<int64_t>(result);
}

bool flag(py::handle value, const std::string& name) {
  if (!PyBool_Check(value.ptr()) && !PyNumber_Check(value.ptr())) throw py::type_error(name + ": expected a bool");
  return py::bool_(py::reinterpret_borrow<py::object>(value)).cast<bool>();
}

std::string type_name(py::handle value) { return py::str(py::type::of(value).attr("__name__")); }

namespace {

// The configuration table (engine.h: zf_engine_config_key), read once.
const std::vector<zf_engine_config_key>& config_keys() {
  static const std::vector<zf_engine_config_key> keys = [] {
    std::vector<zf_engine_config_key> out(zf_engine_config_key_count());
    for (size_t i = 0; i < out.size(); ++i) check(zf_engine_config_key_at(i, &out[i]));
    return out;
  }();
  return keys;
}

std::vector<std::string> choice_names(const zf_engine_config_key& k) {
  std::vector<std::string> out;
  std::string rest = k.choices;
  for (size_t comma; (comma = rest.find(',')) != std::string::npos; rest = rest.substr(comma + 1))
    out.push_back(rest.substr(0, comma));
  out.push_back(rest);
  return out;
}

// Field access through the table's offsets (the table says each field's type and size).
char* field(zf_engine_config& c, const zf_engine_config_key& k) { return reinterpret_cast<char*>(&c) + k.offset; }

void write_field(zf_engine_config& c, const zf_engine_config_key& k, double real, int64_t whole) {
  if (k.type == ZF_CONFIG_FLOAT) {
    std::memcpy(field(c, k), &real, sizeof real);
  } else if (k.size == sizeof(int32_t)) {
    const auto v = static_cast<int32_t>(whole);
    std::memcpy(field(c, k), &v, sizeof v);
  } else {
    std::memcpy(field(c, k), &whole, sizeof whole);
  }
}

// A field whose 0 stands for a word ("auto", "window"; "none" is None in Python), as opposed
// to a number ("1": ranks_per_host's 0 counts as 1).
bool zero_is_word(const std::string& zero) {
  return !zero.empty() && std::isalpha(static_cast<unsigned char>(zero[0]));
}

// A Python value into field k; the range is the engine's to check (zf_engine_config_check).
// A field whose 0 stands for a word takes the word ("auto", "window"; None for "none"), so a
// plain 0 is refused here: in Python the word says it.
void parse_key(zf_engine_config& c, const zf_engine_config_key& k, py::handle value, const std::string& name) {
  const std::string zero = k.zero_means;
  const bool takes_word = zero_is_word(zero);
  if (takes_word &&
      ((zero == "none" && value.is_none()) || (py::isinstance<py::str>(value) && value.cast<std::string>() == zero))) {
    return write_field(c, k, 0.0, 0);
  }
  const std::string word = zero == "none" ? "None" : "\"" + zero + "\"";
  switch (k.type) {
    case ZF_CONFIG_FLOAT: {
      if (PyBool_Check(value.ptr()) || !PyNumber_Check(value.ptr()) || py::isinstance<py::str>(value)) {
        throw py::type_error(name + ": expected a number" + (takes_word ? " or " + word : "") + ", got " +
                             type_name(value));
      }
      const double v = number(value, name);
      if (takes_word && v == 0.0)
        throw py::value_error(name + ": must be " + k.range_text + ", got 0 (" + zero + " is written " + word + ")");
      return write_field(c, k, v, 0);
    }
    case ZF_CONFIG_INT: {
      if (py::isinstance<py::str>(value)) {
        throw py::value_error(name + ": expected an integer" + (takes_word ? " or " + word : "") + ", got " +
                              std::string(py::repr(value)));
      }
      const int64_t v = integer(value, name);
      if (takes_word && v == 0)
        throw py::value_error(name + ": must be " + k.range_text + ", got 0 (" + zero + " is written " + word + ")");
      if (k.size == sizeof(int32_t) && (v < INT32_MIN || v > INT32_MAX))  // would not fit the field
        throw py::value_error(name + ": must be " + k.range_text + ", got " + std::to_string(v));
      return write_field(c, k, 0.0, v);
    }
    case ZF_CONFIG_BOOL:
      if (!PyBool_Check(value.ptr())) throw py::type_error(name + ": expected a bool, got " + type_name(value));
      return write_field(c, k, 0.0, value.ptr() == Py_True ? 1 : 0);
    case ZF_CONFIG_CHOICE: {
      const std::vector<std::string> names = choice_names(k);
      if (value.is_none() && names[0] == "none") return write_field(c, k, 0.0, 0);  // loss_scaling None
      if (!py::isinstance<py::str>(value)) throw py::type_error(name + ": expected a string, got " + type_name(value));
      {
        const std::string text = value.cast<std::string>();
        for (size_t i = 0; i < names.size(); ++i)
          if (text == names[i]) return write_field(c, k, 0.0, static_cast<int64_t>(i));
      }
      std::string valid;
      for (const std::string& n : names) valid += (valid.empty() ? "\"" : ", \"") + n + "\"";
      throw py::value_error(name + ": expected one of " + valid + ", got " + std::string(py::repr(value)));
    }
  }
}

// Field k of c as Python: the zero word (None for "none"), a bool, a choice's name, a number.
py::object key_value(const zf_engine_config& c, const zf_engine_config_key& k) {
  const char* p = reinterpret_cast<const char*>(&c) + k.offset;
  double real = 0.0;
  int64_t whole = 0;
  if (k.type == ZF_CONFIG_FLOAT) {
    std::memcpy(&real, p, sizeof real);
  } else if (k.size == sizeof(int32_t)) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    whole = v;
  } else {
    std::memcpy(&whole, p, sizeof whole);
  }
  const std::string zero = k.zero_means;
  if (zero_is_word(zero) && real == 0.0 && whole == 0) return zero == "none" ? py::none() : py::object(py::str(zero));
  switch (k.type) {
    case ZF_CONFIG_FLOAT:
      return py::float_(real);
    case ZF_CONFIG_BOOL:
      return py::bool_(whole != 0);
    case ZF_CONFIG_CHOICE:
      return py::str(choice_names(k).at(static_cast<size_t>(whole)));
    default:
      return py::int_(whole);
  }
}

py::dict config_dict(const zf_engine_config& c) {
  py::dict out;
  for (const zf_engine_config_key& k : config_keys()) out[k.name] = key_value(c, k);
  return out;
}

py::list describe_keys() {
  static const char* kTypes[] = {"float", "int", "bool", "choice"};
  const zf_engine_config defaults = zf_engine_config_default();
  py::list out;
  for (const zf_engine_config_key& k : config_keys()) {
    py::dict d;
    d["name"] = k.name;
    d["type"] = kTypes[k.type];
    d["default"] = key_value(defaults, k);
    d["minimum"] = k.minimum;
    d["maximum"] = k.maximum;
    d["minimum_open"] = k.minimum_open != 0;
    d["maximum_open"] = k.maximum_open != 0;
    d["zero_means"] = k.zero_means;
    d["choices"] = k.type == ZF_CONFIG_CHOICE ? py::cast(choice_names(k)) : py::list();
    d["default_text"] = k.default_text;
    d["range_text"] = k.range_text;
    d["meaning"] = k.meaning;
    d["deepspeed_key"] = k.deepspeed_key;
    d["deepspeed_default"] = k.deepspeed_default;
    d["deepspeed_difference"] = k.deepspeed_difference;
    out.append(d);
  }
  return out;
}

}  // namespace

zf_engine_config parse_config(const py::dict& config, bool deepspeed_rules) {
  zf_engine_config c = zf_engine_config_default();
  for (const auto& item : config) {
    if (!py::isinstance<py::str>(item.first)) throw py::type_error("config: keys must be strings");
    const std::string key = item.first.cast<std::string>();
    const std::string name = "config[\"" + key + "\"]";
    if (key == "betas") {
      if (!py::isinstance<py::sequence>(item.second) || py::isinstance<py::str>(item.second) ||
          py::len(item.second) != 2) {
        throw py::value_error(name + ": expected a pair (beta1, beta2)");
      }
      const py::sequence betas = py::reinterpret_borrow<py::sequence>(item.second);
      c.beta1 = number(betas[0], name + "[0]");
      c.beta2 = number(betas[1], name + "[1]");
      continue;
    }
    const zf_engine_config_key* found = nullptr;
    for (const zf_engine_config_key& k : config_keys())
      if (key == k.name) found = &k;
    if (found == nullptr) throw py::value_error("config: unknown key \"" + key + "\"");
    parse_key(c, *found, item.second, name);
  }
  check(deepspeed_rules ? zf_engine_config_check_deepspeed(&c) : zf_engine_config_check(&c));
  return c;
}

EngineGroups parse_groups(const py::object& group_list, size_t param_count) {
  EngineGroups out;
  out.param_groups.assign(param_count, -1);
  const size_t group_count = static_cast<size_t>(PySequence_Fast_GET_SIZE(group_list.ptr()));
  for (size_t g = 0; g < group_count; ++g) {
    const std::string name = "groups[" + std::to_string(g) + "]";
    const py::handle entry = PySequence_Fast_GET_ITEM(group_list.ptr(), static_cast<Py_ssize_t>(g));
    if (!py::isinstance<py::dict>(entry)) throw py::type_error(name + ": expected a dict");
    const py::dict group = py::reinterpret_borrow<py::dict>(entry);
    for (const auto& item : group) {
      const std::string key = py::str(item.first);
      if (key != "params" && key != "lr" && key != "weight_decay" && key != "dense") {
        throw py::value_error(name + ": unknown key \"" + key + "\"");
      }
    }
    if (!group.contains("params") || !group.contains("lr")) {
      throw py::value_error(name + ": needs \"params\" (indices into params) and \"lr\"");
    }
    zf_engine_group c_group{};
    c_group.lr = number(group["lr"], name + "[\"lr\"]");
    c_group.weight_decay =
        group.contains("weight_decay") ? number(group["weight_decay"], name + "[\"weight_decay\"]") : 0.0;
    c_group.dense = group.contains("dense") && flag(group["dense"], name + "[\"dense\"]") ? 1 : 0;
    const py::object indices = as_fast_sequence(group["params"], (name + "[\"params\"]").c_str());
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(indices.ptr()); ++j) {
      const std::string index_name = name + "[\"params\"][" + std::to_string(j) + "]";
      const int64_t index = integer(PySequence_Fast_GET_ITEM(indices.ptr(), j), index_name);
      if (index < 0 || static_cast<size_t>(index) >= param_count) {
        throw py::value_error(index_name + ": " + std::to_string(index) + " is not a parameter index (there are " +
                              std::to_string(param_count) + ")");
      }
      if (out.param_groups[static_cast<size_t>(index)] != -1) {
        throw py::value_error(index_name + ": parameter " + std::to_string(index) + " is in two groups");
      }
      out.param_groups[static_cast<size_t>(index)] = static_cast<int32_t>(g);
    }
    out.groups.push_back(c_group);
  }
  for (size_t i = 0; i < param_count; ++i) {
    if (out.param_groups[i] == -1) throw py::value_error("groups: parameter " + std::to_string(i) + " is in no group");
  }
  return out;
}

void register_engine_config(py::module_& m) {
  m.def("config_keys", &describe_keys,
        "The engine's configuration table (engine.h: zf_engine_config_key_at), one dict per field: name, type, "
        "default (as Python: None / \"auto\" for a zero sentinel), range, zero_means, choices, meaning, "
        "deepspeed_key, deepspeed_default (a JSON literal), deepspeed_difference.");
  m.def(
      "check_config",
      [](const py::dict& config, bool deepspeed_rules) { return config_dict(parse_config(config, deepspeed_rules)); },
      py::arg("config"), py::arg("deepspeed_rules") = false,
      "Parses and checks a config dict as Engine() does (zf_engine_config_check; with deepspeed_rules, "
      "zf_engine_config_check_deepspeed) and returns every field's value "
      "(defaults filled in). Unknown key: ValueError; wrong type: TypeError; out of range: the engine's "
      "ValueError; each names the key.");
  m.def(
      "engine_thread_plan",
      [](const py::object& config) {
        const zf_engine_config c = config.is_none() ? zf_engine_config_default() : parse_config(config);
        zf_engine_thread_plan plan{};
        check(zf_engine_thread_plan_for(&c, &plan));
        py::dict out;
        out["cores"] = plan.cores;
        out["compute_threads"] = plan.compute_threads;
        out["host_threads"] = plan.host_threads;
        out["framework_threads"] = plan.framework_threads;
        return out;
      },
      py::arg("config") = py::none(),
      "The engine's thread plan for a config dict (engine.h: zf_engine_thread_plan_for): this rank's cores, "
      "the compute and host lanes' threads, and the framework's intra-op threads beside them.");
}

}  // namespace zf_py
