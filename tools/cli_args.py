"""Command-line helpers shared by the Python tools (installed beside them)."""
import re


def join_negative_values(argv, stop=("--",)):
    """argparse takes a value such as -5MB or -1gbit after a flag for another flag ('expected
    one argument'): join it to its flag (--model=-5MB) so that the flag's own check refuses it
    by name. No flag starts with a dash and a digit. The words from the first of `stop` on (a
    command passed on) are left alone."""
    out = []
    for i, arg in enumerate(argv):
        if arg in stop:
            return out + list(argv[i:])
        if re.match(r"-\.?\d", arg) and out and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] += "=" + arg
        else:
            out.append(arg)
    return out
