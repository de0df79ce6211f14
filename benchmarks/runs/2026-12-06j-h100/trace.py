# Summarizes a chain trace (call_v.sh; chain-trace.patch): one line a block, 32 slots (the patch
# states them). FIRST / RB: the gate-up units and row blocks an item of the K2.5 one-token round.
import sys, statistics as st
FIRST=256; RB=16
rows=[list(map(int,l.strip().split(','))) for l in open(sys.argv[1]) if l.strip()]
rows=[r for r in rows if r[0]>0]
t0=min(r[0] for r in rows)
us=lambda t:(t-t0)/1000.0
print("blocks",len(rows),"span_us %.2f"%us(max(r[31] for r in rows)))
w=[us(r[0]) for r in rows]; print("pdl return: min %.2f med %.2f max %.2f"%(min(w),st.median(w),max(w)))
gu=[];dn=[]
for r in rows:
  for i in range(7):
    u=r[2+4*i]
    if u==0: break
    u-=1; rec=(u,us(r[3+4*i]),us(r[4+4*i]),us(r[5+4*i]),r[1],i)
    (gu if u<FIRST else dn).append(rec)
def q(xs):
  xs=sorted(xs); n=len(xs)
  return "min %.2f p10 %.2f med %.2f p90 %.2f max %.2f"%(xs[0],xs[n//10],xs[n//2],xs[9*n//10],xs[-1])
print("gate-up units",len(gu))
print(" taken ",q([g[1] for g in gu]))
print(" products done",q([g[2] for g in gu]))
print(" unit done",q([g[3] for g in gu]))
print(" duration",q([g[3]-g[1] for g in gu]))
pair={}
for g in gu:
  p=(g[0]//RB)//2; pair[p]=max(pair.get(p,0),g[3])
print(" pair complete", " ".join("%d:%.2f"%(k,v) for k,v in sorted(pair.items())))
print("down tiles",len(dn))
print(" taken ",q([d[1] for d in dn]))
print(" wait over",q([d[2] for d in dn]))
print(" waited",q([d[2]-d[1] for d in dn]))
print(" after wait to done",q([d[3]-d[2] for d in dn]))
print(" done ",q([d[3] for d in dn]))
print("exits",q([us(r[31]) for r in rows]))
# timeline histogram of active work per 1us
import collections
for name,recs in (("gate-up",gu),("down",dn)):
  h=collections.Counter()
  for rec in recs:
    for t in range(int(rec[1]),int(rec[3])+1): h[t]+=1
  print(name,"busy blocks per us:"," ".join("%d:%d"%(t,h[t]) for t in sorted(h)))
diffs=sorted(set((r[3]-r[0]) for r in rows if r[3]>0))[:10]
print("resolution sample (ns):",diffs)
