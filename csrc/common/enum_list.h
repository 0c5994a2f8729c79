// The enumerations that cross to Python are each listed once, as an X-macro of
// X(CppName, value, "python_name") entries: the enum class is made from its list
// (CPUPROF_ENUM_VALUE), so is its count where one is needed (CPUPROF_ENUM_COUNT), and bindings.cpp
// binds every entry of the same list as a py::enum_ member (cpuprof._native.<Enum>.<python_name>).
// A value added in C++ is therefore in Python at once, and tests/integration/test_native_crossings.py
// fails until cpuprof/native.py gives it the name the profile model saves (KIND_NAMES).
// Comments inside a list are /* */: a // comment would swallow the line continuation.
#pragma once

#define CPUPROF_ENUM_VALUE(name, value, py_name) name = value,
#define CPUPROF_ENUM_COUNT(name, value, py_name) +1
