// Precompiled once per machine for the graphs steersman compiles with inductor's C++
// wrapper (steersman.recipes.precompiled._install_wrapper_build): the wrapper's header and
// the kernels' prefix, which each graph's file would otherwise parse from text.
#include <torch/csrc/inductor/cpp_wrapper/cpu.h>
#include <torch/csrc/inductor/cpp_prefix.h>
