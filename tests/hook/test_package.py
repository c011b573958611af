"""The hook's package keeps its own rules: stdlib only (it runs inside any user's job), and
its modules import each other one way, in the order its __init__ lists them."""

import ast
import os
import re
import sys
import unittest

from support import HOOK_DIR

PACKAGE = os.path.join(HOOK_DIR, "vramtop_hook")


def imports_of(path):
    """(stdlib or other top-level modules, sibling modules) that `path` imports."""
    with open(path) as f:
        tree = ast.parse(f.read())
    outside, siblings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            outside.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                outside.add(node.module.split(".")[0])
            elif node.module:
                siblings.add(node.module)
            else:
                siblings.update(alias.name for alias in node.names)
    return outside, siblings


class PackageTest(unittest.TestCase):
    def modules(self):
        return sorted(n[:-3] for n in os.listdir(PACKAGE) if n.endswith(".py"))

    def test_only_the_standard_library_is_imported(self):
        if not hasattr(sys, "stdlib_module_names"):  # Python < 3.10
            self.skipTest("sys.stdlib_module_names needs Python 3.10")
        for name in self.modules() + ["../sitecustomize"]:
            outside, _ = imports_of(os.path.join(PACKAGE, name + ".py"))
            # torch is only ever reached through the module the job imported, never imported;
            # the bootstrap imports the package itself.
            allowed = set(sys.stdlib_module_names) | {"vramtop_hook"}
            self.assertEqual(outside - allowed, set(), name)

    def test_modules_import_only_those_listed_before_them(self):
        with open(os.path.join(PACKAGE, "__init__.py")) as f:
            doc = ast.get_docstring(ast.parse(f.read()))
        order = re.findall(r"^  ([a-z_]+) {2,}", doc, re.M)
        self.assertEqual(sorted(order), [m for m in self.modules() if m != "__init__"])
        for i, name in enumerate(order):
            _, siblings = imports_of(os.path.join(PACKAGE, name + ".py"))
            self.assertLessEqual(siblings, set(order[:i]), name)


if __name__ == "__main__":
    unittest.main()
