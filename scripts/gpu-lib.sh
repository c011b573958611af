# Shared by the GPU scripts (source it): tmux on a server of this run's own, so that ending
# it never touches the tmux sessions of whoever runs the script.
VT_TMUX_SERVER="vramtop-check-$$"
vt_tmux() { tmux -L "$VT_TMUX_SERVER" "$@"; }
vt_tmux_end() { tmux -L "$VT_TMUX_SERVER" kill-server 2> /dev/null; }
