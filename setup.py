"""The package list only; everything else is in pyproject.toml.

linter/ installs as tmpl_lint and rules/ as tmpl_lint.rules (package-dir in pyproject.toml).
setuptools' own package discovery cannot rename a folder, so the subpackages of linter/ are
found here: a new one installs without a list to keep.
"""

from setuptools import find_packages, setup

setup(packages=["tmpl_lint", *(f"tmpl_lint.{name}" for name in find_packages("linter")), "tmpl_lint.rules"])
