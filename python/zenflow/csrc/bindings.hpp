// One registration function per op family (one file per public header); module.cpp calls
// them all.
#pragma once

#include <pybind11/pybind11.h>

namespace zf_py {
void register_norms(pybind11::module_& m);
void register_topk(pybind11::module_& m);
void register_optim(pybind11::module_& m);
void register_pack(pybind11::module_& m);
void register_cpu_adamw(pybind11::module_& m);
void register_engine(pybind11::module_& m);
}  // namespace zf_py
