"""Static analysis of a template: parse once (parsing), interpret its Jinja AST abstractly
(interpreter, values, folding) into the facts every rule queries (facts), reuse one
analysis in a switch trial (reuse); exact source positions (locations) and tool-argument
separators (separators)."""
