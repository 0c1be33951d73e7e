"""The private names of torch, Lightning and Accelerate the package relies on: one module per framework, each name
with why it is needed and a gate on the installed version. No other module names a private framework name."""
