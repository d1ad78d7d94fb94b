"""python_headers_repository: the C headers of Debian's /usr/bin/python3, as a cc_library.

The include directory is asked of the interpreter itself (sysconfig), so the extension is built
for the Python that will import it, whatever `python3` on PATH is. Runs locally; never
downloads anything.
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)
"""

def _impl(rctx):
    python = rctx.attr.python
    res = rctx.execute([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
    if res.return_code != 0:
        fail("%s cannot tell its include directory (is python3-dev installed?):\n%s" % (python, res.stderr))
    include = res.stdout.strip()
    if not rctx.path(include + "/Python.h").exists:
        fail("%s/Python.h is missing: install python3-dev (tools/setup.sh)" % include)
    rctx.symlink(include, "include")
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", _BUILD)

python_headers_repository = repository_rule(
    implementation = _impl,
    attrs = {"python": attr.string(default = "/usr/bin/python3")},
    local = True,
)
