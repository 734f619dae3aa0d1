// ops_data.h: the reader of a launch's named parameters, host code of the CUDA launchers (common.cuh includes
// it) and of the CPU kernels that read names (cpu_common.h includes it). jittor's CHECK and LOGf (fatal) are in
// scope wherever a code op's source is compiled.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

// A launch's named parameters as ops/_launch.py packs them (``pack_named``: every CUDA launch, and the CPU
// launches that read names): one `data` key "$name=value,name=value,..." instead of an entry each, since jt.code
// builds and frees a map node per entry on every call (a permute's 17 entries cost 0.72 us of a 1.2 us jt.code on a 2-core host, the packed key 0.21).
// The launch's source sees it under jittor's name `data` (a block that shadows the op's map) and reads it as it
// reads a map, data["name"] (or data.at("d", 2) for "d2"), in host code. A name the launch did not pass is a
// fatal error naming it (jittor's map would read 0).
struct OpsData {
  static constexpr int kMax = 48;
  const char* name[kMax];
  int len[kMax];
  double value[kMax];
  int n = 0;

  template <class Map> explicit OpsData(const Map& data) {
    for (const auto& kv : data) {
      const std::string& key = kv.first;
      if (key.empty() || key[0] != '$') continue;
      const char* p = key.c_str() + 1;
      while (*p) {
        const char* eq = std::strchr(p, '=');
        CHECK(eq && n < kMax);  // ops/_launch.py packs at most kMax names, each with its '='
        name[n] = p;
        len[n] = (int)(eq - p);
        value[n] = parse(eq + 1, &p);
        ++n;
        if (*p == ',') ++p;
      }
    }
  }
  // An integer digit by digit (exact below 2^53; the launches' are), anything else (a float as Python's repr
  // wrote it) by strtod; *end: the character after the value.
  static double parse(const char* s, const char** end) {
    const char* q = s + (*s == '-');
    long long v = 0;
    for (; *q >= '0' && *q <= '9'; ++q) v = v * 10 + (*q - '0');
    if (*q == ',' || *q == 0) {
      *end = q;
      return (double)(*s == '-' ? -v : v);
    }
    char* e = nullptr;
    const double d = std::strtod(s, &e);
    *end = e;
    return d;
  }

  double operator[](const char* key) const {
    const int k = (int)std::strlen(key);
    for (int i = 0; i < n; ++i)
      if (len[i] == k && std::memcmp(name[i], key, k) == 0) return value[i];
    // one operand: jittor's log puts blanks between the operands of <<
    LOGf << std::string("ops: the kernel reads data[\"") + key + "\"], which its launch did not pass";
    return 0.0;
  }
  double operator[](const std::string& key) const { return (*this)[key.c_str()]; }
  // data["<name><i>"]: an entry of a per-dim list ("d0", "d1", ...)
  double at(const char* key, int i) const {
    char full[32];
    std::snprintf(full, sizeof(full), "%s%d", key, i);
    return (*this)[full];
  }
};
