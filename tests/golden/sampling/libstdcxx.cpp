// libstdcxx.json: what libstdc++ (GCC 12) gives for the pieces ggtool.generate.libstdcxx copies:
// std::mt19937's words, std::uniform_real_distribution<double|float>, std::discrete_distribution,
// and the order std::sort and std::partial_sort leave equal keys in (llama.cpp's comparator:
// logit greater). Build and run: g++ -O2 -o /tmp/l libstdcxx.cpp && /tmp/l > libstdcxx.json
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>
struct T { int id; float logit; };
static void order(const char *what, int n, int k, int levels, unsigned seed, bool last) {
  std::mt19937 g(seed);
  std::vector<T> v(n);
  for (int i = 0; i < n; i++) { v[i].id = i; v[i].logit = (float)(g() % levels) * 0.5f; }
  auto comp = [](const T &a, const T &b) { return a.logit > b.logit; };
  if (k == n) std::sort(v.begin(), v.end(), comp); else std::partial_sort(v.begin(), v.begin() + k, v.end(), comp);
  printf("  {\"what\": \"%s\", \"n\": %d, \"k\": %d, \"levels\": %d, \"seed\": %u, \"ids\": [", what, n, k, levels, seed);
  for (int i = 0; i < k; i++) printf("%s%d", i ? "," : "", v[i].id);
  printf("]}%s\n", last ? "" : ",");
}
int main() {
  printf("{\"mt19937_5489_10000th\": ");
  { std::mt19937 g; unsigned long x = 0; for (int i = 0; i < 10000; i++) x = g(); printf("%lu,\n", x); }
  printf("\"uniform\": [");
  { std::mt19937 g(42); std::uniform_real_distribution<double> d(0.0, 1.0); std::uniform_real_distribution<float> f(0.0f, 1.0f);
    for (int i = 0; i < 4; i++) printf("%.17g, ", d(g));
    for (int i = 0; i < 4; i++) printf("%.9g%s", (double)f(g), i < 3 ? ", " : "],\n"); }
  printf("\"discrete\": [");
  { std::mt19937 g(3); std::vector<float> w = {0.5f, 0.25f, 0.125f, 0.0625f, 0.0625f};
    std::discrete_distribution<int> d(w.begin(), w.end());
    for (int i = 0; i < 12; i++) printf("%d%s", d(g), i < 11 ? ", " : "],\n"); }
  printf("\"orders\": [\n");
  order("sort", 40, 40, 3, 1, false);
  order("sort", 300, 300, 7, 2, false);
  order("sort", 1000, 1000, 2, 3, false);
  order("partial_sort", 500, 40, 5, 4, false);
  order("partial_sort", 2000, 128, 50, 5, false);
  order("partial_sort", 100, 99, 1, 6, true);
  printf("]}\n");
}
