# Argument handling shared by the scripts, sourced before they do any work. usage prints the
# calling script's header comment (from line 2 to the first line that is not a comment) as its
# help; no_arguments NAME "$@" prints it for -h/--help and exits 0, and refuses any other
# argument with a one-line error (exit 2); check_names NAME VARIABLE ALLOWED VALUES refuses
# (exit 2) a word of VALUES that is not a word of ALLOWED, naming the variable that gave it.
# shellcheck shell=bash
usage() { sed -n '2,/^[^#]/{/^# shellcheck/d; s/^# \{0,1\}//p}' "$0"; }

no_arguments() {
  local name=$1 arg
  shift
  for arg in "$@"; do
    case $arg in
    -h | --help) usage; exit 0 ;;
    *) echo "$name: unknown argument '$arg' (see: bash $0 --help)" >&2; exit 2 ;;
    esac
  done
}

check_names() {
  local name=$1 variable=$2 allowed=$3 value
  for value in $4; do
    [[ " $allowed " == *" $value "* ]] ||
      { echo "$name: $variable names '$value', not one of: $allowed" >&2; exit 2; }
  done
}
