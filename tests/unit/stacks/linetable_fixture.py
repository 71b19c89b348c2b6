# Prints the co_linetable fixture of stacks_test.cpp (run with python3.11 and python3.12):
# the first line, the table in hex, and co_lines() as {byte offset,line} for every code unit.
import sys
src = "\n"*200 + '''
def f(x):
    total = 0
    for i in range(x):
        if i % 3 == 0:
            total += i
        else:
            total -= 1
''' + "\n"*100 + '''
    try:
        y = [j * 2 for j in range(total)]
    except ValueError:
        y = None
    return (total,
            y)
'''
ns = {}
exec(compile(src, "fixture.py", "exec"), ns)
co = ns["f"].__code__
lines = {}
for start, end, line in co.co_lines():
    for a in range(start, end, 2):
        lines[a] = -1 if line is None else line
print(sys.version.split()[0], co.co_firstlineno)
print(co.co_linetable.hex())
print(",".join(f"{{{a},{l}}}" for a, l in sorted(lines.items())))
