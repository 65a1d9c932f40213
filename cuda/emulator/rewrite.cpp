// The CUDA emulator's source rewriter, a build-time tool: copies one CUDA source (.cu or .cuh)
// and replaces the two constructs a host C++ compiler cannot parse:
//   kernel<<<grid, block, smem, stream>>>(args...)
//     -> ::minamp::emu::launch_kernel(::minamp::emu::kernel_address(kernel), grid, block, smem,
//                                     stream, [=](const auto&... a) { kernel(a...); }, args...)
//   (the kernel's address, its shared-memory limit's key, only where smem is given and not 0:
//   a kernel whose template arguments are deduced from the call has no address to take, and
//   needs none without dynamic shared memory; nullptr there)
//   extern __shared__ __align__(16) T name[];
//     -> T* name = ::minamp::emu::dynamic_shared_memory<T>();
// and adds two calls for checks a GPU makes: after each static shared declaration, the call
// that gives the variable garbage (NaN bytes) in every block, and at the start of a kernel with
// launch bounds, the call that fails a launch with more threads than they allow:
//   __shared__ T name[N];
//     -> __shared__ T name[N]; ::minamp::emu::static_shared_memory(&name, sizeof(name));
//   __global__ void __launch_bounds__(B) kernel(params) {
//     -> __global__ void __launch_bounds__(B) kernel(params) {
//        ::minamp::emu::check_launch_bounds(B);
// Everything else is copied as is. A #line directive and newlines kept in place make compiler
// errors and __FILE__/__LINE__ (CUDA_CHECK messages) name the original file and line.
//
// Usage: minamp_emulator_rewrite INPUT OUTPUT
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}

// The start of the kernel expression that ends just before `end`: a (qualified) name, optionally
// followed by a template argument list, e.g. `sum_finish_kernel<kValues>`.
size_t kernel_start(const std::string& s, size_t end) {
  size_t i = end;
  while (i > 0 && std::isspace(static_cast<unsigned char>(s[i - 1]))) --i;
  if (i > 0 && s[i - 1] == '>') {
    int depth = 0;
    do {
      --i;
      if (s[i] == '>') ++depth;
      if (s[i] == '<') --depth;
    } while (i > 0 && depth > 0);
  }
  while (i > 0 && is_name_char(s[i - 1])) --i;
  return i;
}

// The index just past the parenthesis that closes the one at `open`.
size_t matching_paren(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '"') { // skip string literals: they may hold parentheses
      for (++i; i < s.size() && s[i] != '"'; ++i)
        if (s[i] == '\\') ++i;
      continue;
    }
    if (s[i] == '(') ++depth;
    if (s[i] == ')' && --depth == 0) return i + 1;
  }
  throw std::runtime_error("unbalanced parentheses in a kernel launch's arguments");
}

// The parts of a launch configuration split at its top-level commas, each trimmed.
std::vector<std::string> config_parts(const std::string& config) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char c : config) {
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0)
      parts.emplace_back();
    else
      parts.back() += c;
  }
  for (std::string& part : parts) {
    part.erase(0, part.find_first_not_of(" \t\r\n"));
    part.erase(part.find_last_not_of(" \t\r\n") + 1);
  }
  if (parts.size() < 2 || parts.size() > 4)
    throw std::runtime_error("expected <<<grid, block[, smem[, stream]]>>>");
  return parts;
}

// The launch_kernel arguments before the kernel: its address (see the header) and the
// configuration with CUDA's defaults filled in (<<<grid, block>>> and <<<grid, block, smem>>> get
// shared memory 0 and the default stream).
std::string launch_config(std::string kernel, const std::string& config) {
  const std::vector<std::string> parts = config_parts(config);
  std::replace(kernel.begin(), kernel.end(), '\n', ' '); // one copy keeps the line breaks
  const bool dynamic_shared = parts.size() > 2 && parts[2] != "0";
  return (dynamic_shared ? "::minamp::emu::kernel_address(" + kernel + ")" : "nullptr") + ", " +
         config + (parts.size() < 3 ? ", 0" : "") + (parts.size() < 4 ? ", nullptr" : "");
}

size_t count_newlines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

// Which characters of a source are code, not comments or string and character literals.
std::vector<bool> code_mask(const std::string& s) {
  std::vector<bool> code(s.size(), true);
  for (size_t i = 0; i < s.size(); ++i) {
    size_t end = i;
    if (s.compare(i, 2, "//") == 0) {
      end = s.find('\n', i);
    } else if (s.compare(i, 2, "/*") == 0) {
      end = s.find("*/", i + 2);
      end = end == std::string::npos ? end : end + 2;
    } else if (s[i] == '"' || s[i] == '\'') {
      for (end = i + 1; end < s.size() && s[end] != s[i]; ++end)
        if (s[end] == '\\') ++end;
      ++end;
    } else {
      continue;
    }
    end = std::min(end, s.size());
    std::fill(code.begin() + long(i), code.begin() + long(end), false);
    i = end - 1;
  }
  return code;
}

// Replaces every kernel<<<...>>>(...) launch in code, keeping the line count.
std::string rewrite_launches(const std::string& s) {
  const std::vector<bool> code = code_mask(s);
  std::string out;
  size_t copied = 0;
  for (size_t at = s.find("<<<"); at != std::string::npos; at = s.find("<<<", at + 3)) {
    if (!code[at]) continue;
    const size_t start = kernel_start(s, at);
    const size_t config_end = s.find(">>>", at);
    if (start < copied || config_end == std::string::npos)
      throw std::runtime_error("cannot parse the kernel launch at offset " + std::to_string(at));
    size_t open = config_end + 3;
    while (open < s.size() && std::isspace(static_cast<unsigned char>(s[open]))) ++open;
    if (open >= s.size() || s[open] != '(')
      throw std::runtime_error("expected '(' after >>> at offset " + std::to_string(config_end));
    const size_t close = matching_paren(s, open);
    const std::string kernel = s.substr(start, at - start);
    const std::string config = launch_config(kernel, s.substr(at + 3, config_end - at - 3));
    const std::string args = s.substr(open + 1, close - open - 2);
    const bool has_args = args.find_first_not_of(" \t\r\n") != std::string::npos;
    std::string call = "::minamp::emu::launch_kernel(" + config +
                       ", [=](const auto&... emu_args) { " + kernel + "(emu_args...); }" +
                       (has_args ? ", " + args : "") + ")";
    const std::string original = s.substr(start, close - start);
    for (size_t lines = count_newlines(call); lines < count_newlines(original); ++lines)
      call += '\n';
    out.append(s, copied, start - copied);
    out += call;
    copied = close;
    at = close - 3;
  }
  out.append(s, copied, std::string::npos);
  return out;
}

std::string rewrite_dynamic_shared(const std::string& s) {
  static const std::regex declaration(
      R"(extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;)");
  return std::regex_replace(s, declaration, "$1* $2 = ::minamp::emu::dynamic_shared_memory<$1>();");
}

// Run after rewrite_dynamic_shared, so the extern declarations are gone.
std::string rewrite_static_shared(const std::string& s) {
  static const std::regex declaration(
      R"(__shared__\s+([A-Za-z_][\w:\s<>,]*?)\s+(\w+)\s*((?:\[[^\]]*\]\s*)*);)");
  return std::regex_replace(
      s, declaration, "__shared__ $1 $2$3; ::minamp::emu::static_shared_memory(&$2, sizeof($2));");
}

// Puts check_launch_bounds(bounds) first in the body of every kernel defined with
// __launch_bounds__(bounds), on the line of its opening brace.
std::string rewrite_launch_bounds(const std::string& s) {
  static const std::string keyword = "__launch_bounds__";
  const std::vector<bool> code = code_mask(s);
  std::string out;
  size_t copied = 0;
  for (size_t at = s.find(keyword); at != std::string::npos; at = s.find(keyword, at + 1)) {
    const size_t open = s.find_first_not_of(" \t\r\n", at + keyword.size());
    if (!code[at] || open == std::string::npos || s[open] != '(') continue;
    const size_t bounds_end = matching_paren(s, open);
    const size_t params = s.find('(', bounds_end);
    if (params == std::string::npos)
      throw std::runtime_error("no parameter list after __launch_bounds__ at offset " +
                               std::to_string(at));
    const size_t body = s.find_first_not_of(" \t\r\n", matching_paren(s, params));
    if (body == std::string::npos || s[body] != '{') continue; // a declaration
    out.append(s, copied, body + 1 - copied);
    out += " ::minamp::emu::check_launch_bounds" + s.substr(open, bounds_end - open) + ";";
    copied = body + 1;
  }
  out.append(s, copied, std::string::npos);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " INPUT OUTPUT\n"
              << "Rewrites a CUDA source for the CPU emulator (kernel launches, shared "
                 "memory declarations, launch bounds).\n";
    return 2;
  }
  try {
    const std::string text = rewrite_launch_bounds(
        rewrite_static_shared(rewrite_dynamic_shared(rewrite_launches(read_file(argv[1])))));
    const std::string tmp = std::string(argv[2]) + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      out << "#line 1 \"" << argv[1] << "\"\n" << text;
      if (!out) throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), argv[2]) != 0)
      throw std::runtime_error("cannot write " + std::string(argv[2]));
  } catch (const std::exception& e) {
    std::cerr << "minamp_emulator_rewrite: " << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
