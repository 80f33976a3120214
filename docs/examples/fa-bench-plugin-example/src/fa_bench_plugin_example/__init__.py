"""An example fa-bench plugin package; `impls` registers its implementation."""
