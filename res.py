#!/usr/bin/env python3
# usage: res.py FILE SPEC...   SPEC per conflict: o (ours), t (theirs), ot, to, or @path (custom text file)
import sys,re
fn=sys.argv[1]; specs=sys.argv[2:]
lines=open(fn).read().split('\n')
out=[];i=0;k=0
while i<len(lines):
    l=lines[i]
    if l.startswith('<<<<<<< '):
        o=[];t=[];i+=1
        while not lines[i].startswith('======='): o.append(lines[i]); i+=1
        i+=1
        while not lines[i].startswith('>>>>>>> '): t.append(lines[i]); i+=1
        s=specs[k]; k+=1
        if s.startswith('@'): out.extend(open(s[1:]).read().rstrip('\n').split('\n'))
        else:
            for c in s:
                out.extend(o if c=='o' else t)
    else: out.append(l)
    i+=1
assert k==len(specs),(k,len(specs))
open(fn,'w').write('\n'.join(out))
