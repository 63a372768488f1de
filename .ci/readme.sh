# Sourced by .ci/run and .ci/matrix: the README's set-up commands, the one place they are read from.
# Each sits in the README on the first line of the fenced block after a <!-- setup:NAME --> marker.

readme_command() {  # readme_command install|test [README]
  awk -v m="<!-- setup:$1 -->" '$0 == m {found=1; next} found && /^```/ {if (inblock) exit; inblock=1; next} found && inblock {print; exit}' "${2:-README.md}"
}

readme_commands() {  # sets install_cmd and test_cmd from README (default README.md), or fails saying which is missing
  install_cmd=$(readme_command install "${1:-README.md}")
  test_cmd=$(readme_command test "${1:-README.md}")
  [ -n "$install_cmd" ] || { echo "CI: README has no setup:install command" >&2; return 1; }
  [ -n "$test_cmd" ] || { echo "CI: README has no setup:test command" >&2; return 1; }
}
