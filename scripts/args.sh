# Argument handling shared by the scripts, sourced before they do any work. usage prints the
# calling script's header comment (from line 2 to the first line that is not a comment) as its
# help; no_arguments NAME "$@" prints it for -h/--help and exits 0, and refuses any other
# argument with a one-line error (exit 2).
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
