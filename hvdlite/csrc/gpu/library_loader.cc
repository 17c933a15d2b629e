#include "gpu/library_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace hvdlite {
namespace {

std::mutex g_mu;
std::map<std::string, std::vector<std::string>> g_folders;

bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The file a loaded handle came from (for messages and --check-build): where one of
// its symbols lives.
std::string PathOf(void* handle, const char* probe_symbol, const std::string& fallback) {
  Dl_info info;
  if (void* sym = dlsym(handle, probe_symbol))
    if (dladdr(sym, &info) && info.dli_fname) return info.dli_fname;
  return fallback;
}

}  // namespace

void SetLibrarySearchFolders(const std::string& library, const std::vector<std::string>& folders) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_folders[library] = folders;
}

std::vector<std::string> LibrarySearchFolders(const std::string& library) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_folders.find(library);
  return it == g_folders.end() ? std::vector<std::string>{} : it->second;
}

SharedLibrary::~SharedLibrary() {
  // Deliberately left open: see the class comment.
}

std::shared_ptr<SharedLibrary> SharedLibrary::Open(const std::string& library, const std::string& display, const char* env,
                                                   const std::vector<std::string>& sonames, const char* probe_symbol,
                                                   std::string* error) {
  std::string tried;
  auto note = [&](const std::string& what, const char* why) {
    tried += "\n  " + what + (why && *why ? std::string(": ") + why : std::string());
  };
  auto wrap = [&](void* h, const std::string& path) {
    return std::shared_ptr<SharedLibrary>(new SharedLibrary(h, PathOf(h, probe_symbol, path)));
  };
  const int flags = RTLD_NOW | RTLD_LOCAL;
  if (const char* path = std::getenv(env); path && *path) {
    if (void* h = dlopen(path, flags)) return wrap(h, path);
    *error = "hvdlite could not load " + display + ": " + env + "=" + path + " could not be opened (" + dlerror() +
             "). Searched only that file, as the variable asks";
    return nullptr;
  }
  for (const std::string& name : sonames) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD)) return wrap(h, name);
  }
  note("already loaded in this process (" + sonames.front() + ", ...)", "no");
  for (const std::string& folder : LibrarySearchFolders(library)) {
    for (const std::string& name : sonames) {
      const std::string path = folder + "/" + name;
      if (!IsFile(path)) continue;
      if (void* h = dlopen(path.c_str(), flags)) return wrap(h, path);
      note(path, dlerror());
    }
    note(folder + "/{" + sonames.front() + ", ...}", "not found");
  }
  for (const std::string& name : sonames) {
    if (void* h = dlopen(name.c_str(), flags)) return wrap(h, name);
    note("the system's search for " + name, dlerror());
  }
  *error = "hvdlite could not load " + display + " (set " + env + " to its path). Searched:" + tried;
  return nullptr;
}

void* SharedLibrary::Symbol(const char* symbol) const { return dlsym(handle_, symbol); }

}  // namespace hvdlite
