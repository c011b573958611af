# Shared by the GPU scripts (source it).
#
# tmux on a server of this run's own, so that ending it never touches the tmux sessions
# of whoever runs the script.
VT_TMUX_SERVER="vramtop-check-$$"
vt_tmux() { tmux -L "$VT_TMUX_SERVER" "$@"; }
vt_tmux_end() { tmux -L "$VT_TMUX_SERVER" kill-server 2> /dev/null; }

# One row format for every check of every part: "check|status|detail" (status: ok, FAIL,
# MISS, info or skip). vt_row appends the row to the file $VT_ROWS when it is set (each
# part sets a default; gpu-check.sh names one per part and reads them back) and prints
# it as "[status] check: detail".
vt_row() {
  if [ -n "${VT_ROWS:-}" ]; then printf '%s|%s|%s\n' "$1" "$2" "$3" >> "$VT_ROWS"; fi
  printf '[%s] %s: %s\n' "$2" "$1" "$3"
}
